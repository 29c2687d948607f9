"""Which addresses a request's URL may reach (artemis/netguard.py): an explicit list of
internal ranges, looked for inside the IPv6 forms that wrap an IPv4 address."""

from __future__ import annotations

import ipaddress

import pytest

from artemis.netguard import AllowList, is_internal


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.31.255.255",
        "192.168.0.1",
        "169.254.169.254",  # cloud metadata
        "100.100.100.200",  # shared address space (a cloud's metadata)
        "0.0.0.0",
        "192.0.0.192",  # IETF protocol assignments: global to some Python patch levels
        "192.0.2.1",
        "198.18.0.1",
        "224.0.0.1",
        "255.255.255.255",
        "::1",
        "::",
        "fe80::1",
        "fd00::1",
        "ff02::1",
        "::ffff:127.0.0.1",  # IPv4-mapped loopback
        "::ffff:169.254.169.254",
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
        "64:ff9b:1::1",  # local-use NAT64
        "2002:7f00:1::1",  # 6to4 of 127.0.0.1
        "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
        "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo, client 127.0.0.1
        "::127.0.0.1",  # IPv4-compatible
        "2001:db8::1",
    ],
)
def test_internal_addresses_in_every_wrapping(address):
    assert is_internal(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    "address",
    ["8.8.8.8", "93.184.216.34", "2606:4700:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"],
)
def test_public_addresses(address):
    assert not is_internal(ipaddress.ip_address(address))


def test_only_ip_and_cidr_entries_admit_an_internal_address():
    allow = AllowList(["localhost", "*.example.com", "10.0.0.0/8", "127.0.0.1:8300"])
    assert allow.admits(ipaddress.ip_address("10.9.8.7"))
    assert allow.admits(ipaddress.ip_address("::ffff:10.9.8.7"))  # the same, mapped
    assert allow.admits(ipaddress.ip_address("127.0.0.1"), 8300)
    assert not allow.admits(ipaddress.ip_address("127.0.0.1"), 6379)  # pinned port
    assert not allow.admits(ipaddress.ip_address("::1"))  # "localhost" is a name
    assert not allow.admits(ipaddress.ip_address("169.254.169.254"))
    assert allow.admits(ipaddress.ip_address("8.8.8.8"))  # public: the name decides
    # names: exact, wildcard, an IP literal inside a listed network
    assert allow.match("localhost") == "exact"
    assert allow.match("api.example.com") == "wildcard"
    assert allow.match("10.1.1.1") == "exact"
    assert allow.match("evil.org") is None

"""What each field of the registry YAML means: the descriptions of the file models
(``file_models.py``), so ``artemis registry schema``, its JSON Schema and docs/registry.md's field
reference say the same thing. A column with no entry here fails the test suite.

Every column acts: a field Artemis cannot honour is refused at import with the reason,
never stored to do nothing.
"""

from __future__ import annotations

# The one description of a run's bad-record bound: the registry field, the run param's
# schema and the docs say it in these words (artemis/quarantine/: RecordPolicy.bound).
MAX_BAD_RECORDS = (
    "how many records a run may quarantine before it fails `BAD_RECORDS`: a count "
    "(`100`), or a percentage (`1%`, the default) of the records fetched so far, of the "
    "total the source states, or of 1,000 records, whichever is largest (at the default, "
    "a run of up to 1,000 records may set 10 aside)"
)

SECTIONS = {
    "provenance": "the source itself (`reg_provenance`); one per file",
    "endpoint_def": "the requests: one row per endpoint (`SEARCH` lists records, "
    "`DETAIL` fetches them by id)",
    "window_offset_cfg": "time windows of `update` and `backfill` runs",
    "pagination_cfg": "how the SEARCH endpoint pages, where its records are and how paging ends",
    "http_cfg": "how requests travel: base URL override, headers, timeouts, TLS, proxy, "
    "compression",
    "batching_cfg": "DETAIL requests by id batch: E-utilities efetch, or any source's "
    "DETAIL endpoint fed the ids its SEARCH pages give",
    "retry_cfg": "which statuses are retried, back-off, circuit breaker, outage tolerance",
    "rate_limit_cfg": "the provenance's request rate, held across every worker",
    "credential": "API keys, tokens, HTTP Basic logins, OAuth2 clients and refresh tokens, "
    "session logins; secrets are named by environment variable",
    "record_model": "the shape of the provenance's records, dated like every dimension: "
    "a family Artemis normalises (`PUBMED`, `CROSSREF`: the paper shape) or the records' "
    "own fields and key, which are the `sql` sink's table columns (the key its primary "
    'key) and the Parquet schema. Records are checked strictly (`"1.5"` is not a float, '
    "`1` not a bool; an ISO string is a date). A model that only adds nullable fields "
    "adds their columns, and one that turns a required field `| None` lets its column "
    "take nulls; a changed type or key is refused when a run starts. A record "
    "that does not fit is quarantined (kept aside with its reason, the run goes on; "
    "`artemis quarantine replay` lands it once the model is fixed) or fails the run, and "
    "a field the model does not name is a `schema_drift` event: the policy columns below",
    "record_model_shorthand": "the short form of one `record_model` row (scope `SOURCE`, "
    "in force from 1970-01-01): `{key: [...], fields: {...}}`",
}

# Every dimension row has these (scope and effective interval).
COMMON = {
    "scope_code": "`SOURCE`: for every task type; `TASK`: for `task_type` only (wins over SOURCE)",
    "task_type": "with scope `TASK`: the task type the row is for",
    "effective_from": "the row is in force from this instant (UTC, ISO 8601) ...",
    "effective_to": "... up to this one, excluded (null: open-ended)",
}

FIELDS: dict[str, dict[str, str]] = {
    "provenance": {
        "provenance_code": "the provenance's code: `source_harvest -p provenance=CODE` "
        "(a paper family: `literature_harvest`); its default table and folder name",
        "provenance_name": "a display name (default: the code)",
        "base_url_default": "the base URL requests go to (`http_cfg.base_url_override` wins)",
        "timezone_default": "the source's IANA time zone (default `UTC`): a run's days "
        "start at its midnight, calendar windows align to it, `ISO` window parameters are "
        "written in it",
        "docs_url": "where the source's API is documented",
        "lifecycle_status_code": "`ACTIVE` (default) runs; any other status (`PAUSED`, "
        "`RETIRED`…) is refused when a run starts, naming it",
        "record_model": "short for one `record_model` row from 1970 on: `{key: [id], "
        "fields: {id: int, name: str, price: float | None}}`",
    },
    "record_model": {
        "resource_name": 'the resource this row belongs to (docs/registry.md "Resources"): '
        "a name (letters, digits, `_`, `-`); left out, the provenance's own resource (a file "
        "of one endpoint has only that one)",
        "record_family_code": "`PUBMED` (E-utilities esearch + efetch, PubMed XML) or "
        "`CROSSREF` (Crossref works JSON): records normalised to the paper shape of "
        "`literature_harvest`; leave out to declare fields",
        "key_json": "the fields that identify a record, e.g. `[id]` (the table's primary key)",
        "fields_json": "field name to type: `str`, `int`, `float`, `bool`, `date`, "
        "`datetime`, `list[str]`, `list`, `dict` or `json` (JSON text in Parquet, JSON in "
        "SQL), each `| None` when it may be null; or a mapping of sub-fields typed the "
        "same way: a struct (a Parquet struct of those fields, JSON in SQL; null or absent "
        "allowed)",
        "on_bad_record_code": "`QUARANTINE` (default): a record the model or the task's "
        "process step rejects is kept aside with its reason and the run goes on; `FAIL`: it "
        "fails the run. A run's `on_bad_record` param wins",
        "max_bad_records_value": f"{MAX_BAD_RECORDS}. A run's `max_bad_records` param wins",
        "schema_contract_code": "a field the model does not name: `DISCARD` (default: "
        "dropped, a `schema_drift` event), `FREEZE` (the run fails `SOURCE_CONTRACT` "
        "naming it) or `EVOLVE` (dropped from this run, added to the model of the next "
        "runs as nullable: a new row of this section from that moment). A run's "
        "`schema_contract` param wins",
        "coerce_types_enabled": "`true`: values are read laxly against the fields' types "
        '(`"1.5"` a float, `"7"` an int, `"true"` a bool: a source that writes numbers '
        "as strings) and land converted; default `false`: a value of another JSON type "
        "does not fit. A run's `coerce_types` param wins",
        "record_steps_json": "steps that shape each record before the check, in order "
        '(docs/resources.md "Shaping records"): a list of one-key mappings, '
        "`{rename: {from: _id, to: doc_id}}` (a key under a field's name), "
        "`{map: {from: $.attributes.title, to: title}}` (the value at a JSONPath into the "
        "record), `{add: {to: source, from: provenance}}` (`value: ...` a constant, `from: "
        "provenance` the provenance's code, `from: window_start` the run's window start), "
        "`{drop: [type, attributes]}` (keys removed), `{filter: {path: $.type, equals: "
        "articles}}` (only the records with a value there, or that value, go on; the others "
        "are counted as `records_filtered`). A value `rename` or `map` does not find is "
        "null; with `required: true` the record is quarantined naming the step. Every field "
        "a step sets is one the model declares",
    },
    "endpoint_def": {
        "endpoint_name": "a name, unique within the provenance (a credential may name it)",
        "endpoint_usage_code": "what the endpoint is for: `SEARCH` (the one a harvest pages "
        "through), `DETAIL` (records by id: E-utilities efetch, or the ids a SEARCH's "
        "records give, see `batching_cfg`), `TOKEN` (where an "
        "`OAUTH2_CLIENT_CREDENTIALS` or `OAUTH2_REFRESH_TOKEN` credential gets its access "
        "tokens, always a POST of a form, and a `SESSION_TOKEN` credential logs in, a POST "
        "of `request_content_type`; its `path_template` may be a whole `https://` URL "
        "(`http://` on loopback only: no secret is sent in clear) when the "
        "authorization server is elsewhere, which is then reached with the workers' "
        "defaults, not the source's `http_cfg`)",
        "http_method_code": "`GET` (default) or `POST`. A GET search sends a run's values "
        "(`query`, the window) in the query string; a POST search sends them in its body "
        "over `default_body_payload` (a dot in a name nests it), and "
        "`default_query_params` in the query string. A DETAIL endpoint's method (id lists "
        "longer than `post_threshold_ids` go by POST)",
        "path_template": "the path after the base URL, e.g. `/products`",
        "default_query_params": "query parameters sent on every request "
        "(`{format: json}`; a run's own values override them, a null removes one)",
        "default_body_payload": "a POST request's body, a mapping (`{query: {match_all: "
        "{}}, sort: [_doc]}`): a run's own values and the paging parameters (with "
        "`paging_params_in_code: BODY`) override its keys, a null removes one. Refused on "
        "a GET search; on a GET DETAIL endpoint it is the body of the batches sent by POST "
        "(`post_threshold_ids`)",
        "request_content_type": "how a request body is written: `application/json` "
        "(default) or `application/x-www-form-urlencoded` (text, numbers and lists of "
        "them: a nested value is refused)",
        "response_format_code": "`JSON` (default) or `XML`. An XML answer is read by XML "
        "paths (ElementTree's XPath subset from the root element, starting with `.`: "
        "`./channel/item`, `.//entry`, `./result[@type='hits']/doc`; a trailing `/@name` "
        "reads an attribute; `{*}tag` matches any namespace) in the pagination and "
        "batching `*_jsonpath` columns; a value is the element's text (an empty element is "
        "null). Each record element becomes a mapping: attributes as `@name`, child "
        "elements by tag (namespace dropped), a leaf child as its text, any other as a "
        "nested mapping (its text as `#text`), a repeated tag as a list; fields the record "
        "model types `int`, `float`, `bool` or as a list are converted. Entity "
        "declarations are refused",
        "is_auth_required": "a run using this endpoint needs a usable credential for it "
        "(`ACTIVE`, in force, with its secrets; bound to this endpoint or to none): without "
        "one the run fails `CONFIG_ERROR` when it starts, before any request (default "
        "false)",
        "page_param_name": "the page-number parameter for this endpoint "
        "(wins over `pagination_cfg.page_number_param_name`)",
        "page_size_param_name": "the page-size parameter (wins over `pagination_cfg`'s)",
        "cursor_param_name": "the cursor parameter (wins over `pagination_cfg`'s)",
        "offset_param_name": "the offset parameter (wins over `pagination_cfg`'s)",
        "limit_param_name": "the limit parameter (wins over `pagination_cfg`'s)",
        "token_param_name": "the page-token parameter (wins over `pagination_cfg`'s)",
        "id_param_name": "the id-list parameter of a DETAIL endpoint (wins over `batching_cfg`'s)",
        "resource_name": 'the resource this row belongs to (docs/registry.md "Resources"): '
        "a name (letters, digits, `_`, `-`); left out, the provenance's own resource (a file "
        "of one endpoint has only that one)",
        "parent_resource_name": "a sub-resource's parent resource: the SEARCH endpoint is "
        "asked once per parent record, `{parent.field}` in `path_template`, "
        "`default_query_params` and `default_body_payload` taking that record's value "
        "(percent-encoded in a path)",
        "include_from_parent_json": "parent fields copied into each record of a sub-resource: "
        "a list (`[number]`: a field `{parent resource}_number`) or a mapping of parent "
        "field to the record's field (`{number: issue_number}`)",
        "output_name": "the table and folder a resource lands in (default "
        "`{provenance}__{resource}`; the provenance's own resource: the provenance's code)",
        "response_actions_json": "answers that are not errors, or errors inside a 200 "
        '(docs/registry.md "Answers that are not errors"): a list of rules, each matching a '
        "`status` (one or a list) and/or the body (`jsonpath` where a value is, or with "
        "`equals` that value; `contains` a substring of the body), all of a rule's conditions "
        "holding, with an `action`: `ignore` (no records: a SEARCH's paging ends there, a "
        "DETAIL batch is skipped; counted as `responses_ignored` in the run's stats), `retry` "
        "(a transient failure, waited out as a 503 is) or `fail` (with `code`, an error code, "
        "default `SOURCE_ERROR`). The first rule that matches acts, before the status is "
        "looked at",
    },
    "window_offset_cfg": {
        "resource_name": 'the resource this row belongs to (docs/registry.md "Resources"): '
        "a name (letters, digits, `_`, `-`); left out, the provenance's own resource (a file "
        "of one endpoint has only that one)",
        "window_mode_code": "`SLIDING`: fixed-size windows; `CALENDAR`: calendar months "
        "(with unit `MONTH`)",
        "window_size_value": "a backfill's window size, in `window_size_unit_code` units",
        "window_size_unit_code": "unit of `window_size_value`",
        "overlap_value": "an update starts this far before the watermark",
        "overlap_unit_code": "unit of `overlap_value`",
        "lookback_value": "how far back the first update of a query looks when it has no "
        "`start` (without it, that run needs `start`)",
        "lookback_unit_code": "unit of `lookback_value`",
        "watermark_lag_seconds": "an update ends this long before now (records the source "
        "has not indexed yet)",
        "offset_type_code": "what an update's pointer is: `DATE` (default; an instant: the "
        "window's end, or the largest `watermark_field_name`), `ID` (the largest id), "
        "`COMPOSITE` (the largest timestamp, ties broken by id)",
        "default_date_field_name": "the source's date field a window filters on (PubMed "
        "`EDAT`, Crossref `index-date`); for a source of no paper family, the record field "
        "a DATE or COMPOSITE pointer is read from when `watermark_field_name` is not set",
        "window_start_param_name": "where a window's first instant is sent, e.g. "
        "`updated_since` (sources of no paper family; without it a run asks no window)",
        "window_end_param_name": "where a window's end is sent (exclusive; leave out when "
        "the source takes only a start)",
        "window_time_format": "how an instant is written in those parameters: a `strftime` "
        "pattern (`%Y-%m-%d`), `ISO` (default, `2024-05-01T00:00:00+00:00` in the source's "
        "`timezone_default`), `EPOCH` or `EPOCH_MS`",
        "watermark_field_name": "the record field an `update` keeps its pointer from: the "
        "largest value among the run's records (DATE, COMPOSITE: a timestamp, ISO 8601 or "
        "seconds since 1970 — milliseconds with `EPOCH_MS`; ID: an id); "
        "without it (and without `default_date_field_name`) the pointer is the window's end",
        "watermark_id_field_name": "COMPOSITE: the record's id field, which orders records "
        "of the same timestamp",
        "watermark_id_param_name": "ID: the parameter the pointer (minus `overlap_value` "
        "ids) is sent in; COMPOSITE: where the pointer's id is sent with its timestamp",
    },
    "pagination_cfg": {
        "resource_name": 'the resource this row belongs to (docs/registry.md "Resources"): '
        "a name (letters, digits, `_`, `-`); left out, the provenance's own resource (a file "
        "of one endpoint has only that one)",
        "pagination_mode_code": "how the source pages: `PAGE_NUMBER`, `OFFSET`, `CURSOR`, "
        "`TOKEN`, `SCROLL` (a scroll id carried from answer to answer, as Elasticsearch's "
        "`_search?scroll=1m`: see the `scroll_*` fields), `LINK_HEADER` (RFC 8288 "
        '`rel="next"`), `NEXT_URL` (the next page\'s URL in the answer, at '
        "`next_url_jsonpath`) or `SINGLE` (one request, no paging parameter: its records "
        "are the whole resource; the paging fields are refused)",
        "page_size_value": "records per page asked for (a run's `page_size` wins)",
        "max_page_size_value": "the largest page size the source allows",
        "page_number_param_name": "PAGE_NUMBER: the page parameter (default `page`)",
        "page_size_param_name": "the page-size parameter, sent in every mode when a page "
        "size is set (default `page_size`; CURSOR `rows`; SCROLL `size`, on the opening "
        "request only; LINK_HEADER and NEXT_URL on the first request, and on a next URL "
        "only when it lacks it; never with SINGLE)",
        "start_page_number": "PAGE_NUMBER: the first page's number (default 1)",
        "offset_param_name": "OFFSET: the offset parameter (default `offset`)",
        "limit_param_name": "OFFSET: the limit parameter (default `limit`)",
        "cursor_param_name": "CURSOR: the cursor parameter (default `cursor`)",
        "next_cursor_jsonpath": "CURSOR: where the next cursor is (null ends; default "
        "`$.next_cursor`)",
        "initial_cursor_value": "CURSOR: what the first request sends (Crossref `*`)",
        "token_param_name": "TOKEN: the token parameter (default `page_token`)",
        "next_token_jsonpath": "TOKEN: where the next token is (null ends; default "
        "`$.next_page_token`)",
        "total_count_jsonpath": "where the source states how many records there are "
        "(checked at the end: a shortfall fails `INCOMPLETE`)",
        "records_jsonpath": "where a page's records are (default `$.items`; with an XML "
        "SEARCH endpoint this and the other answer paths are XML paths, e.g. "
        "`./channel/item`, `./@total`, required)",
        "max_result_window": "the most records the source lists for one query (a bigger "
        "window is split in halves)",
        "short_page_is_last": "the source documents that a page shorter than the page size "
        "is the last",
        "absent_token_is_last": "TOKEN: the source leaves the token out on the last page",
        "record_key_jsonpath": "what identifies a raw record, a JSONPath into the record "
        "(an XML record is a mapping: `$['@id']`); a page repeating the last one's keys is "
        "`SOURCE_LOOP`; default the whole record",
        "completeness_tolerance_pct": "the shortfall against the stated total a run "
        "accepts, in percent (default 0)",
        "stateful_cursor": "CURSOR: the server keeps the walk's position (a retry re-opens "
        "the session)",
        "next_page_jsonpath": "PAGE_NUMBER/OFFSET: where the source's next page number (or "
        "next offset) is, on every page; null or false ends paging",
        "next_url_jsonpath": "NEXT_URL: where the answer holds the next page's URL "
        "(default `$.next`; `$['@odata.nextLink']`, `$.links.next`; a relative URL is "
        "resolved against the page's; another origin is refused); null or absent: the last "
        "page; anything else but a URL breaks the contract",
        "has_more_jsonpath": "PAGE_NUMBER/OFFSET: where the source's true/false \"more "
        'pages" flag is, on every page; false ends paging',
        "paging_params_in_code": "where the paging parameters (page, size, offset, limit, "
        "cursor, token, scroll id) go: `QUERY` (default, the query string) or `BODY` (the "
        "body of a POST search, where a dot in a parameter name nests it: `page.size` is "
        "`{page: {size: 50}}`); not with `LINK_HEADER`, `NEXT_URL` or `SINGLE`",
        "scroll_path_template": "SCROLL (required): where a scroll continues, after the "
        "base URL (`/_search/scroll`). A continue request carries only the keep-alive and "
        "the latest scroll id (where `paging_params_in_code` says); the first request is "
        "the search itself. Paging ends on an empty page (or the stated total). A resumed "
        "attempt or an expired scroll (404) opens a new scroll from the start (at most 3 "
        "times in a row for expiry): a scroll cannot be rewound, so records already "
        "delivered come again (sinks write by key) and the count starts over",
        "scroll_keep_alive_value": "SCROLL: how long the server keeps the scroll between "
        "requests (default `1m`)",
        "scroll_keep_alive_param_name": "SCROLL: the keep-alive's parameter (default "
        "`scroll`; on the opening request always in the query string)",
        "scroll_id_jsonpath": "SCROLL: where an answer's scroll id is (default "
        "`$._scroll_id`; required on a page with records; the latest one is used)",
        "scroll_id_param_name": "SCROLL: the scroll id's parameter in continue and release "
        "requests (default `scroll_id`)",
        "scroll_release_path_template": "SCROLL: where a scroll is released by `DELETE` "
        "with its id (`/_search/scroll`): after the last page, before a re-opened scroll, "
        "and when the fetch fails or is cancelled. A fetch that stops between pages "
        "keeps it (the next batch continues it); without this field the server lets it "
        "expire",
    },
    "http_cfg": {
        "base_url_override": "replaces `provenance.base_url_default`",
        "default_headers_json": "headers sent on every request to the source's origin "
        "(`{User-Agent: ...}`; a null removes one; a `TOKEN` endpoint elsewhere gets none); "
        "never `Authorization`, `Proxy-Authorization` or `Cookie` (a "
        "secret belongs in a credential) nor `Accept-Encoding` (`accept_compress`)",
        "timeout_connect_millis": "how long establishing a connection (TCP and TLS "
        "handshake, or to the proxy) may take (default: the read timeout)",
        "timeout_read_millis": "read timeout (default `http_client.timeout_seconds`)",
        "tls_verify_enabled": "false: this source's TLS certificates are not verified "
        "(default true: verified against the workers' trust store, or "
        "`tls_ca_bundle_path`)",
        "tls_ca_bundle_path": "a CA bundle file (PEM) on the workers that this source's "
        "certificates are verified against instead of the trust store (an absolute path; "
        "not with `tls_verify_enabled: false`)",
        "proxy_url": "an `http://` proxy every request to this source's origin goes "
        "through (an `https` source by `CONNECT`); it replaces the environment's "
        "`HTTP(S)_PROXY`. No user or password in it (a proxy login is not supported)",
        "accept_compress": "true or absent: answers may come gzip- or deflate-compressed "
        "(`Accept-Encoding` lists what the client decodes); false: `Accept-Encoding: "
        "identity`",
        "prefer_http2": "only false is accepted: the workers' HTTP client speaks HTTP/1.1 "
        "(true is refused)",
        "max_body_bytes": "the largest answer read, after decompression (default "
        "`http_client.max_body_bytes`)",
    },
    "batching_cfg": {
        "detail_batch_size": "ids per DETAIL request (default 200)",
        "id_param_name": "the id-list parameter (default `id`)",
        "id_joiner": "what joins the ids (default `,`)",
        "max_parallel_requests": "DETAIL requests in flight at once (bounded by the run's "
        "fetch concurrency and `max_concurrency`)",
        "post_threshold_ids": "id lists longer than this go by POST (PubMed default 200; "
        "other sources: none, the endpoint's method)",
        "request_template_json": "how a DETAIL request carries a batch of ids: "
        "`{params: {...}, body: {...}}` merged over the DETAIL endpoint's query parameters "
        "and (on a POST) body. In its string values and in the endpoint's `path_template`, "
        "`{ids}` is the ids joined by `id_joiner`, `{id}` the one id of a batch "
        "(`detail_batch_size: 1`, e.g. `/items/{id}`), and a value that is exactly "
        '`"{ids_json}"` becomes the list of ids. Without it the ids go in `id_param_name` '
        "(query string of a GET, body of a POST)",
        "detail_id_jsonpath": "where a SEARCH record's id is, a JSONPath into the record "
        "(default `pagination_cfg.record_key_jsonpath`; one of the two is required with a "
        "DETAIL endpoint)",
        "detail_records_jsonpath": "where a DETAIL answer's records are (default `$.items`; "
        "an object there is one record, as `GET /items/{id}` answers; an XML path for an "
        "XML DETAIL endpoint, required there)",
    },
    "retry_cfg": {
        "max_retries": "retries of a failed fetch (default 4)",
        "backoff_policy_code": "`EXPONENTIAL` doubles the delay, `FIXED` keeps it",
        "initial_delay_millis": "the first retry's delay (default 1000)",
        "max_delay_millis": "the longest delay between retries (default 30000)",
        "retry_http_statuses_json": "statuses always retried, e.g. `[429, 503]`",
        "giveup_http_statuses_json": "statuses never retried, e.g. `[400, 404]`",
        "respect_retry_after": "a `Retry-After` header sets the next retry's delay",
        "circuit_break_threshold": "failed attempts in a row before the run rests",
        "circuit_cool_down_millis": "how long it rests (a durable timer; default 60000)",
        "outage_tolerance_millis": "how long an outage is waited out before "
        "`SOURCE_UNAVAILABLE` (default `runs.outage_tolerance_s`; 0 fails fast)",
    },
    "rate_limit_cfg": {
        "qps_limit": "requests per second, across every worker process",
        "burst_capacity": "requests allowed ahead of the rate (1: evenly spaced)",
        "max_concurrency": "requests in flight at once per worker",
        "bucket_granularity_code": "what `qps_limit` and `burst_capacity` hold, across "
        "every worker: `GLOBAL` (default) the provenance's requests together; `PER_KEY` "
        "each credential's (requests without one share a gate); `PER_ENDPOINT` each "
        "endpoint's",
        "ratelimit_headers_code": "the source's own rate-limit headers, read on every "
        'answer (docs/registry.md "Rate-limit headers"): `NONE` (default) none; '
        "`X_RATELIMIT` a remaining and a reset header (`X-RateLimit-Remaining`, "
        "`X-RateLimit-Reset`: GitHub's); `IETF` the `RateLimit` and `RateLimit-Policy` "
        "fields of draft-ietf-httpapi-ratelimit-headers. An answer whose remaining is at "
        "most `remaining_reserve_value` closes the gate (`bucket_granularity_code`'s) "
        "until the reset, for every worker; works with or without `qps_limit`",
        "remaining_header_name": "the header holding the requests left (default "
        "`X-RateLimit-Remaining`; `IETF`: the field holding `r` and `t`, default "
        "`RateLimit`)",
        "reset_header_name": "`X_RATELIMIT`: the header holding the reset (default "
        "`X-RateLimit-Reset`)",
        "policy_header_name": "`IETF`: the field holding the policies, whose window `w` "
        "stands for a missing `t` (default `RateLimit-Policy`)",
        "reset_format_code": "how the reset is written: `EPOCH_SECONDS` (the instant, Unix "
        "seconds: GitHub; the `X_RATELIMIT` default), `DELTA_SECONDS` (seconds from the "
        "answer: the `IETF` draft, its only one), `EPOCH_MILLIS` or `DELTA_MILLIS`",
        "remaining_reserve_value": "the gate closes once the remaining is at most this "
        "(default 0). Requests already past the gate still reach the source: with `n` in "
        "flight across the workers, `n - 1` keeps them inside the budget",
    },
    "credential": {
        "credential_name": "a name, unique within the provenance",
        "auth_type_code": "how the secret is sent: `API_KEY_QUERY` (a query parameter), "
        "`API_KEY_HEADER` (a header), `BEARER` (`Authorization: Bearer`), `BASIC` (HTTP "
        "Basic: `principal_env` the user, `secret_env` the password), "
        "`OAUTH2_CLIENT_CREDENTIALS` (`principal_env` the client id, `secret_env` the "
        "client secret, sent only to the provenance's `TOKEN` endpoint; the access token it "
        "issues goes as `Authorization: Bearer`, kept until `expires_in` (less a margin) or "
        "a 401, then fetched again), `OAUTH2_REFRESH_TOKEN` (`secret_env` the refresh "
        "token, `principal_env` the client id, `client_secret_env` its secret: "
        "`grant_type=refresh_token` at the `TOKEN` endpoint, one refresh at a time across "
        "every worker, a refresh token the server rotates kept sealed in the database for "
        "the next refresh; the access token as with client credentials) or `SESSION_TOKEN` "
        "(`principal_env` the user, `secret_env` the password: a login at the `TOKEN` "
        "endpoint, its answer's token at `token_jsonpath` sent in `param_or_header_name` "
        "until a 401, then one new login)",
        "param_or_header_name": "the query parameter or header it goes in (defaults "
        "`api_key`, `X-API-Key`, `Authorization`); a `SESSION_TOKEN` in `Authorization` goes "
        "as `Bearer <token>`, in any other header as the token itself",
        "token_auth_method_code": "`OAUTH2_CLIENT_CREDENTIALS` and `OAUTH2_REFRESH_TOKEN`: "
        "how the client id and secret reach the token endpoint: `CLIENT_SECRET_BASIC` "
        "(default, an HTTP Basic header), `CLIENT_SECRET_POST` (`client_id` and "
        "`client_secret` in the form body) or, for a refresh token's public client, `NONE` "
        "(`client_id` in the form, no secret)",
        "client_secret_env": "`OAUTH2_REFRESH_TOKEN`: the environment variable holding the "
        "client secret at import (required unless `token_auth_method_code: NONE`; stored "
        "encrypted like the secret; the same rules as `secret_env`)",
        "token_jsonpath": "`SESSION_TOKEN`: where the login's JSON answer holds the session "
        "token (default `$.token`)",
        "is_default_preferred": "tried before the other keys",
        "lifecycle_status_code": "`ACTIVE` keys are used; any other value sets one aside",
        "deleted": "a deleted key is never used",
        "secret_env": "the environment variable holding the secret at import (stored "
        "encrypted; never written in the file); never one of the service's own "
        "(`COOKIE_MASTER_KEY`, `ARTEMIS_*`, `DATABASE_URL`, `PG*`, `TEMPORAL_*`, `REDIS_*`, "
        "`AWS_*`, `GOOGLE_*`, `AZURE_*`…)",
        "principal_env": "`BASIC`, `OAUTH2_CLIENT_CREDENTIALS`, `OAUTH2_REFRESH_TOKEN` and "
        "`SESSION_TOKEN`: the environment variable holding the user or the client id at "
        "import (stored encrypted like the secret; the same rules as `secret_env`)",
        "endpoint_name": "binds the key to one endpoint: it is used there only, before the "
        "unbound keys (an OAuth2 client: the endpoint its access token is for)",
    },
}


def description(section: str, field: str) -> str | None:
    return FIELDS.get(section, {}).get(field) or COMMON.get(field)

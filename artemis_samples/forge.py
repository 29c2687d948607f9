"""A sample code hosting API ("forge"): an organisation's repositories, each repository's
issues, each issue's comments — a tree of resources, where a sub-resource is asked once
per parent record (``/repos/{parent.full_name}/issues``).

Written from GitHub's public REST documentation, not from Artemis' client: "List
organization repositories" (docs.github.com/rest/repos/repos), "List repository issues"
(docs.github.com/rest/issues/issues), "List issue comments"
(docs.github.com/rest/issues/comments) and "Using pagination in the REST API"
(docs.github.com/rest/using-the-rest-api/using-pagination-in-the-rest-api). It follows
those semantics wherever it does not deviate below:

- ``GET /forge/orgs/{org}/repos`` (``type``: every repository here is public and not a
  fork, so ``private``, ``forks`` and ``internal`` list none; ``sort`` =
  created|updated|pushed|full_name, default created; ``direction``: asc for full_name
  else desc by default; ``per_page``, ``page``); a repository has ``id``, ``name``,
  ``full_name``, ``owner.login``, ``created_at``, ``updated_at``, ``pushed_at``. An
  unknown organisation is a ``404``.
- ``GET /forge/repos/{owner}/{repo}/issues`` (``state`` = open|closed|all, **default
  open**, so a harvest of every issue must pass ``state=all``; ``sort`` =
  created|updated|comments, default created; ``direction`` default desc; ``since``: only
  issues updated at or after it, ISO 8601 ``YYYY-MM-DDTHH:MM:SSZ``); an issue has ``id``,
  ``number``, ``title``, ``state``, ``comments`` (its count), ``created_at``,
  ``updated_at``, ``closed_at``, ``user.login``, ``body``.
- ``GET /forge/repos/{owner}/{repo}/issues/{issue_number}/comments`` (``since``: only
  comments updated at or after it; ordered by ascending id); a comment has ``id``,
  ``body``, ``user.login``, ``created_at``, ``updated_at``.
- ``per_page`` defaults to 30, a larger one than 100 is taken as 100; ``page`` counts
  from 1, and a page past the end is an empty ``200``. Names are not case sensitive.
- Errors are GitHub's bodies: ``404`` ``{"message": "Not Found", "documentation_url":
  …}`` for an organisation, repository, issue or path that does not exist, ``422``
  ``{"message": "Validation Failed", "errors": [...], …}`` for a bad ``since``,
  ``state``, ``sort`` or ``direction``.
- Repositories and issues are paged by a ``Link`` header of absolute URLs (built on the
  host the client used, the request's other parameters kept), as GitHub writes it:
  ``<…?per_page=2&page=1>; rel="prev", <…&page=3>; rel="next", <…&page=25>;
  rel="last", <…&page=1>; rel="first"`` — ``prev`` and ``first`` from the second page
  on, ``next`` and ``last`` up to the page before the last, no header at all when every
  result fits on the first page.

Deliberate deviations from GitHub, so that a harvest's counts can be checked and so that a
second paging style is exercised on the same tree:

- The list answers are envelopes that state a total: repositories and issues answer
  ``{"total_count": N, "items": [...]}`` (the shape of GitHub's *search* API, where the
  list API answers a bare array), ``N`` counting every record the filters match over all
  pages; they are still paged by the ``Link`` header.
- Comments are paged by a next URL in the body instead of a ``Link`` header (the style of
  OData or HAL): ``{"total_count": N, "comments": [...], "next": "<absolute URL of the
  next page>" | null}``, with ``per_page`` and ``page`` as above.
- All paths are under ``/forge`` so that they cannot collide with other sample routes.

The data are deterministic: organisation ``acme`` with ``acme/rockets`` (30 issues),
``acme/anvils`` (20) and ``acme/traps``, which the organisation lists but whose issues
answer ``404``: the repository was deleted after being listed, as happens between a
harvest's listing of the parents and its walk of their children. Issue ``n`` is created
at a fixed instant of 2026 (one day apart), is closed when ``n % 6 == 0`` and has
``n % 5`` comments (0–4, so some span several pages at ``per_page=2``): 50 issues (42
open) and 100 comments in all.

Test controls (``POST /_control/reset`` resets this API too):

- ``GET /forge/_calls``: every request to the API received, in order: ``{"method",
  "path", "query", "status", "at", "done"}`` (``status`` and ``done`` null while the
  request is being answered; ``at``: when it arrived, ``done``: when its answer was
  ready, both ``time.time()`` seconds of the server, so that a test can tell how many
  requests were in flight at once and how long they spanned).
- ``POST /_control/forge`` takes a JSON object of any of: ``{"reset": true}`` (the
  default tree, no calls, no latency, no hang); ``{"touch": [numbers], "repo":
  "acme/rockets", "at": ISO}`` sets those issues' ``updated_at`` to ``at`` (default: now)
  and adds one comment to each, made at ``at`` (``repo`` defaults to the first
  repository); ``{"latency_ms": L}`` delays every API request; ``{"hang_after": N,
  "for_s": S}`` (``for_s`` required) answers the next N API requests and holds every one
  after them until S seconds after the first was held (the clock starts then, since a
  test cannot know when a harvest reaches its Nth request), or until ``hang_after`` is
  set again (``null`` clears it) or a reset; ``{"scale": {"repos": R, "issues": I,
  "comments": C}}``
  regenerates a bigger tree (``acme/repo-0001``…: R repositories, I issues each, C
  comments each, none ``404``, about one in six issues closed).
  ``GET /_control/forge`` tells the latency, the hang (``holding``: requests held now)
  and the tree's size. Neither ``_calls`` nor the controls are recorded, delayed or held.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

ORG = "acme"
ORG_ID = 900
DOCS = "https://docs.github.com/rest"
REPOS_DOC = f"{DOCS}/repos/repos#list-organization-repositories"
ISSUES_DOC = f"{DOCS}/issues/issues#list-repository-issues"
COMMENTS_DOC = f"{DOCS}/issues/comments#list-issue-comments"
DEFAULT_PER_PAGE = 30
MAX_PER_PAGE = 100
REPO_TYPES = ("all", "public", "private", "forks", "sources", "member", "internal")
# Where the issues of every tree begin; they are spread over at most SPAN so that the
# biggest scaled tree still lies within 2026.
ISSUES_FROM = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
SPAN = timedelta(days=300)
# Bounds of a scaled tree: ids (repo, issue, comment) are nested decimals and must not
# collide, and stay far below 2**53 for JSON readers that parse numbers as doubles.
MAX_REPOS, MAX_ISSUES, MAX_COMMENTS = 5_000, 99_999, 9_999
HOLD_STEP_S = 0.05


def stamp(at: datetime) -> str:
    """GitHub's timestamp form: ``2026-01-05T09:00:00Z``."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_instant(text: str) -> datetime:
    """An ISO 8601 instant (``Z`` or an offset; none read as UTC). ValueError if not one."""
    at = datetime.fromisoformat(text.strip())
    return at if at.tzinfo else at.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Repo:
    index: int
    name: str
    issues: int
    comments: int | None  # each issue's comments; None: ``number % 5``
    gone: bool = False  # listed, but deleted: its issues answer 404

    @property
    def id(self) -> int:
        return 1001 + self.index

    @property
    def full_name(self) -> str:
        return f"{ORG}/{self.name}"

    def to_json(self) -> dict[str, Any]:
        created = datetime(2025, 6, 2, 8, 0, tzinfo=UTC) + timedelta(days=self.index)
        updated = datetime(2026, 2, 2, 12, 0, tzinfo=UTC) + timedelta(hours=self.index)
        return {
            "id": self.id,
            "name": self.name,
            "full_name": self.full_name,
            "owner": {"login": ORG, "id": ORG_ID, "type": "Organization"},
            "private": False,
            "description": f"The {self.name} of {ORG}",
            "created_at": stamp(created),
            "updated_at": stamp(updated),
            "pushed_at": stamp(updated),
        }


@dataclass
class Issue:
    repo: Repo
    number: int
    created: datetime
    updated: datetime
    base_comments: int
    extra: list[datetime] = field(default_factory=list)  # when touch added a comment

    @property
    def id(self) -> int:
        return self.repo.id * 100_000 + self.number

    @property
    def state(self) -> str:
        return "closed" if self.number % 6 == 0 else "open"

    @property
    def comment_count(self) -> int:
        return self.base_comments + len(self.extra)

    def to_json(self) -> dict[str, Any]:
        closed = stamp(self.created + timedelta(days=2)) if self.state == "closed" else None
        return {
            "id": self.id,
            "number": self.number,
            "title": f"{self.repo.name}: issue {self.number}",
            "state": self.state,
            "comments": self.comment_count,
            "created_at": stamp(self.created),
            "updated_at": stamp(self.updated),
            "closed_at": closed,
            "user": {"login": f"user{self.number % 7}"},
            "body": f"Issue {self.number} of {self.repo.full_name}.",
        }

    def comment_at(self, k: int) -> datetime:
        if k <= self.base_comments:
            return self.created + timedelta(minutes=k)
        return self.extra[k - self.base_comments - 1]

    def comments_since(self, since: datetime | None) -> list[int]:
        """The positions (from 1) of the comments updated at or after ``since``: numbers,
        not records, so that a page of a big tree renders only its own comments."""
        every = range(1, self.comment_count + 1)
        return [k for k in every if since is None or self.comment_at(k) >= since]

    def comment(self, k: int) -> dict[str, Any]:
        """The issue's k-th comment (from 1): a comment's id orders it within its issue."""
        at = stamp(self.comment_at(k))
        touched = k > self.base_comments
        return {
            "id": self.id * 10_000 + k,
            "body": f"{'Touched' if touched else 'Comment'} {k} on {self.repo.full_name}"
            f"#{self.number}.",
            "user": {"login": f"user{(self.number + k) % 7}"},
            "created_at": at,
            "updated_at": at,
        }


def make_issues(repo: Repo) -> dict[int, Issue]:
    step = max(timedelta(seconds=1), min(timedelta(days=1), SPAN / max(repo.issues, 1)))
    out = {}
    for n in range(1, repo.issues + 1):
        created = ISSUES_FROM + (n - 1) * step
        count = n % 5 if repo.comments is None else repo.comments
        # updated after its last comment, on a day that does not follow the numbers
        updated = max(created + timedelta(days=n % 9, hours=6), created + timedelta(minutes=count))
        out[n] = Issue(repo, n, created, updated, count)
    return out


def default_repos() -> list[Repo]:
    return [
        Repo(0, "rockets", 30, None),
        Repo(1, "anvils", 20, None),
        Repo(2, "traps", 0, None, gone=True),
    ]


def scaled_repos(spec: Any) -> list[Repo]:
    """``{"repos": R, "issues": I, "comments": C}`` (ValueError/TypeError when bad)."""
    if not isinstance(spec, dict):
        raise ValueError("scale is {repos, issues, comments}")
    r, i, c = int(spec["repos"]), int(spec["issues"]), int(spec["comments"])
    if not (1 <= r <= MAX_REPOS and 0 <= i <= MAX_ISSUES and 0 <= c <= MAX_COMMENTS):
        raise ValueError(
            f"scale: 1 <= repos <= {MAX_REPOS}, 0 <= issues <= {MAX_ISSUES}, "
            f"0 <= comments <= {MAX_COMMENTS}"
        )
    return [Repo(k, f"repo-{k + 1:04d}", i, c) for k in range(r)]


class ForgeState:
    """The tree, the calls received, and the latency and hang a test has set."""

    def __init__(self) -> None:
        self.generation = 0  # bumped when a hang is set or reset: held requests go
        self.holding = 0  # requests held now (kept across a reset: they end on their own)
        self.reset()

    def reset(self) -> None:
        self.repos: list[Repo] = default_repos()
        self._issues: dict[str, dict[int, Issue]] = {}  # built on first use (big trees)
        self.calls: list[dict[str, Any]] = []
        self.latency_ms = 0.0
        self.set_hang(None, 0.0)

    def set_hang(self, after: int | None, for_s: float) -> None:
        if (after is not None and after < 0) or for_s < 0:
            raise ValueError("hang_after and for_s must not be negative")
        self.hang_after = after
        self.hang_for_s = for_s
        self.hang_until: float | None = None  # set when the first request is held
        self.seen = 0  # API requests since the hang was set
        self.generation += 1

    def scale(self, spec: Any) -> None:
        self.repos = scaled_repos(spec)
        self._issues = {}

    def repo(self, owner: str, name: str) -> Repo | None:
        full = f"{owner}/{name}".lower()
        return next((r for r in self.repos if r.full_name.lower() == full), None)

    def issues(self, repo: Repo) -> dict[int, Issue]:
        if repo.full_name not in self._issues:
            self._issues[repo.full_name] = make_issues(repo)
        return self._issues[repo.full_name]

    def touch(self, spec: dict[str, Any]) -> None:
        """Mark issues changed at ``at``, as a new comment on each would (ValueError)."""
        name = str(spec.get("repo") or self.repos[0].full_name)
        owner, _, repo_name = name.partition("/")
        repo = self.repo(owner, repo_name)
        if repo is None or repo.gone:
            raise ValueError(f"touch: no repository {name!r} with issues")
        at = parse_instant(spec["at"]) if spec.get("at") else datetime.now(UTC)
        at = at.replace(microsecond=0)
        issues = self.issues(repo)
        numbers = [int(n) for n in spec["touch"]]
        missing = [n for n in numbers if n not in issues]
        if missing:
            raise ValueError(f"touch: {repo.full_name} has no issues {missing}")
        for n in numbers:
            issue = issues[n]
            if issue.comment_count >= MAX_COMMENTS:
                raise ValueError(f"touch: issue {n} has {MAX_COMMENTS} comments already")
            issue.extra.append(at)
            issue.updated = at

    def configure(self, spec: dict[str, Any]) -> None:
        """Apply a ``POST /_control/forge`` object (ValueError/TypeError/KeyError: bad)."""
        if spec.get("reset"):
            self.reset()
        if "scale" in spec:
            self.scale(spec["scale"])
        if "latency_ms" in spec:
            latency = float(spec["latency_ms"] or 0)
            if latency < 0:
                raise ValueError("latency_ms must not be negative")
            self.latency_ms = latency
        if "hang_after" in spec:
            after = spec["hang_after"]
            # for_s is asked for: a hang that forgot it would hold nothing, silently
            for_s = float(spec["for_s"]) if after is not None else 0.0
            self.set_hang(None if after is None else int(after), for_s)
        if "touch" in spec:
            self.touch(spec)

    def describe(self) -> dict[str, Any]:
        left = None
        if self.hang_until is not None:
            left = round(max(0.0, self.hang_until - time.monotonic()), 3)
        return {
            "latency_ms": self.latency_ms,
            "hang_after": self.hang_after,
            "for_s": self.hang_for_s,
            "seen": self.seen,
            "holding": self.holding,
            "seconds_left": left,
            "repos": len(self.repos),
            "issues": sum(r.issues for r in self.repos),
        }

    async def enter(self, request: Request) -> dict[str, Any]:
        """Record an API request, then make it wait as the latency and hang say."""
        call = {
            "method": request.method,
            "path": request.url.path,
            "query": request.url.query,
            "status": None,
            # time.time(), as the quote calls' `at`: a reader in another process (a
            # benchmark) sets them next to its own clock.
            "at": time.time(),
            "done": None,
        }
        self.calls.append(call)
        if self.latency_ms:
            await asyncio.sleep(self.latency_ms / 1000)
        self.seen += 1
        if self.hang_after is not None and self.seen > self.hang_after:
            await self._hold()
        return call

    async def _hold(self) -> None:
        if self.hang_until is None:
            self.hang_until = time.monotonic() + self.hang_for_s
        generation = self.generation
        self.holding += 1
        try:
            while self.generation == generation:
                left = self.hang_until - time.monotonic()
                if left <= 0:
                    return
                await asyncio.sleep(min(HOLD_STEP_S, left))
        finally:
            self.holding -= 1


# -- answers --------------------------------------------------------------------------
def github_error(status: int, message: str, doc: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"message": message, **extra, "documentation_url": doc}, status)


def not_found(doc: str) -> JSONResponse:
    return github_error(404, "Not Found", doc)


def invalid(resource: str, name: str, doc: str) -> JSONResponse:
    errors = [{"resource": resource, "field": name, "code": "invalid"}]
    return github_error(422, "Validation Failed", doc, errors=errors)


def _int(text: str | None, default: int) -> int:
    # GitHub reads a page or per_page it cannot parse as its default, not as an error.
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


def paging(request: Request) -> tuple[int, int]:
    """(page, per_page) as GitHub reads them: per_page 30 by default, 100 at most."""
    per_page = _int(request.query_params.get("per_page"), DEFAULT_PER_PAGE)
    per_page = DEFAULT_PER_PAGE if per_page < 1 else min(per_page, MAX_PER_PAGE)
    return max(1, _int(request.query_params.get("page"), 1)), per_page


def link_header(request: Request, page: int, last: int) -> str | None:
    """GitHub's ``Link``: prev, next, last, first (only those that apply), or None when
    the whole list is on the first page asked."""
    links = []
    if page > 1:
        links.append((page - 1, "prev"))
    if page < last:
        links += [(page + 1, "next"), (last, "last")]
    if page > 1:
        links.append((1, "first"))
    parts = [f'<{request.url.include_query_params(page=p)}>; rel="{rel}"' for p, rel in links]
    return ", ".join(parts) or None


def page_of(items: list[Any], page: int, per_page: int) -> tuple[list[Any], int]:
    """The page's slice and the number of the last page (at least 1)."""
    first = (page - 1) * per_page
    return items[first : first + per_page], max(1, math.ceil(len(items) / per_page))


def enveloped(request: Request, found: list[Any], render: Any) -> Response:
    """A Link-paged list answer in its ``{"total_count", "items"}`` envelope, rendering
    only the page's records (a scaled tree has many)."""
    page, per_page = paging(request)
    chunk, last = page_of(found, page, per_page)
    link = link_header(request, page, last)
    body = {"total_count": len(found), "items": [render(r) for r in chunk]}
    return JSONResponse(body, headers={"Link": link} if link else None)


def since_of(request: Request) -> datetime | None:
    """The ``since`` parameter (ValueError("since") when it is not an instant)."""
    text = request.query_params.get("since")
    try:
        return None if text is None else parse_instant(text)
    except ValueError:
        raise ValueError("since") from None


def _choice(request: Request, name: str, allowed: tuple[str, ...], default: str) -> str:
    """A parameter of a closed set (ValueError(name) for a value outside it)."""
    value = request.query_params.get(name, default)
    if value not in allowed:
        raise ValueError(name)
    return value


def list_repos(state: ForgeState, request: Request, org: str) -> Response:
    if org.lower() != ORG:
        return not_found(REPOS_DOC)
    try:
        kind = _choice(request, "type", REPO_TYPES, "all")
        sort = _choice(request, "sort", ("created", "updated", "pushed", "full_name"), "created")
        default = "asc" if sort == "full_name" else "desc"
        direction = _choice(request, "direction", ("asc", "desc"), default)
    except ValueError as e:
        return invalid("Repository", str(e), REPOS_DOC)
    key = {"created": "created_at", "updated": "updated_at", "pushed": "pushed_at"}.get(sort, sort)
    # every repository here is public, not a fork: those types list none
    none = kind in ("private", "forks", "internal")
    repos = [] if none else [r.to_json() for r in state.repos]
    repos.sort(key=lambda r: (r[key], r["id"]), reverse=direction == "desc")
    return enveloped(request, repos, lambda r: r)


def list_issues(state: ForgeState, request: Request, owner: str, name: str) -> Response:
    repo = state.repo(owner, name)
    if repo is None or repo.gone:
        return not_found(ISSUES_DOC)
    try:
        wanted = _choice(request, "state", ("open", "closed", "all"), "open")
        sort = _choice(request, "sort", ("created", "updated", "comments"), "created")
        direction = _choice(request, "direction", ("asc", "desc"), "desc")
        since = since_of(request)
    except ValueError as e:  # its message is the parameter's name
        return invalid("Issue", str(e), ISSUES_DOC)
    issues = [
        i
        for i in state.issues(repo).values()
        if wanted in ("all", i.state) and (since is None or i.updated >= since)
    ]
    keys = {"created": "created", "updated": "updated", "comments": "comment_count"}
    issues.sort(key=lambda i: (getattr(i, keys[sort]), i.number), reverse=direction == "desc")
    return enveloped(request, issues, Issue.to_json)


def list_comments(
    state: ForgeState, request: Request, owner: str, name: str, number: str
) -> Response:
    repo = state.repo(owner, name)
    issue = None
    if repo is not None and not repo.gone and number.isdigit():
        issue = state.issues(repo).get(int(number))
    if issue is None:
        return not_found(COMMENTS_DOC)
    try:
        since = since_of(request)
    except ValueError:
        return invalid("IssueComment", "since", COMMENTS_DOC)
    found = issue.comments_since(since)
    page, per_page = paging(request)
    chunk, last = page_of(found, page, per_page)
    following = str(request.url.include_query_params(page=page + 1)) if page < last else None
    comments = [issue.comment(k) for k in chunk]
    return JSONResponse({"total_count": len(found), "comments": comments, "next": following})


async def control(state: ForgeState, request: Request) -> Response:
    try:
        spec = await request.json()
    except ValueError:
        spec = None
    if not isinstance(spec, dict):
        return JSONResponse({"error": "a forge control is a JSON object"}, status_code=422)
    try:
        state.configure(spec)
    except (KeyError, TypeError, ValueError) as e:
        return JSONResponse({"error": f"bad forge control {spec!r}: {e}"}, status_code=422)
    return JSONResponse({"ok": True})


def build_router(state: ForgeState) -> APIRouter:
    router = APIRouter()

    async def answered(request: Request, answer: Any, *args: str) -> Response:
        call = await state.enter(request)
        response: Response = answer(state, request, *args)
        call["status"] = response.status_code
        call["done"] = time.time()
        return response

    @router.get("/forge/_calls")
    async def calls() -> list[dict[str, Any]]:
        return state.calls

    @router.get("/forge/orgs/{org}/repos")
    async def repos(request: Request, org: str) -> Response:
        return await answered(request, list_repos, org)

    @router.get("/forge/repos/{owner}/{repo}/issues")
    async def issues(request: Request, owner: str, repo: str) -> Response:
        return await answered(request, list_issues, owner, repo)

    @router.get("/forge/repos/{owner}/{repo}/issues/{number}/comments")
    async def comments(request: Request, owner: str, repo: str, number: str) -> Response:
        return await answered(request, list_comments, owner, repo, number)

    @router.get("/forge/{rest:path}")
    async def elsewhere(request: Request, rest: str) -> Response:
        return await answered(request, lambda *_: not_found(DOCS))

    @router.post("/_control/forge")
    async def set_control(request: Request) -> Response:
        return await control(state, request)

    @router.get("/_control/forge")
    async def get_control() -> dict[str, Any]:
        return state.describe()

    return router

"""The crawl's search phase is per-keyword units; a search checkpoint of one keyword after
another resumes as units: the keywords before it done, the one
it was paging through open at its page, the rest not started."""

from artemis.crawler.task import _search_checkpoint
from artemis.tasks.base import UnitsCheckpoint


def test_an_old_search_checkpoint_resumes_as_units():
    cp = _search_checkpoint({"phase": "search", "k": 2, "page": 3, "digest": "abc"})
    units = UnitsCheckpoint.load(cp["units"])
    assert units.done == {0, 1}
    assert units.open == {2: {"page": 3, "digest": "abc"}}


def test_an_old_checkpoint_at_a_keywords_first_page_leaves_it_unstarted():
    units = UnitsCheckpoint.load(
        _search_checkpoint({"phase": "search", "k": 1, "page": 1})["units"]
    )
    assert units.done == {0} and units.open == {}


def test_new_and_detail_checkpoints_pass_through():
    assert _search_checkpoint(None) == {"phase": "search"}
    assert _search_checkpoint({"phase": "details"}) == {"phase": "details"}
    v2 = {"phase": "search", "units": {"v": 2, "done": [0], "open": {}}}
    assert _search_checkpoint(v2) == v2

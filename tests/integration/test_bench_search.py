"""The search bench's code path at a small scale (docs/performance.md measured it at 1
million instances; that fill is not part of the suite): the fill makes the attributes
the reads expect, every list statement's plan reads the lookup index, and the reads find
what the fill put there."""

from __future__ import annotations

from kenning_devtools.bench import search


def test_the_search_bench_fills_measures_and_reads_the_lookup_index(database_url: str) -> None:
    report = search.run(database_url, instances=500, repeats=3)
    assert report["instances"] == 500
    assert report["plans_use_lookup_index"] == {"customer": True, "region": True, "customer_and_region": True}
    assert report["list_where_customer"]["rows"] == search.PER_CUSTOMER  # 500 / 50 customers
    assert report["list_where_region"]["rows"] == 50  # a full page of about 100 matches
    assert 0 <= report["list_where_customer_and_region"]["rows"] <= search.PER_CUSTOMER
    assert report["get_value"]["rows"] == 1
    for name in ("list_where_customer", "list_where_region", "get_value", "publish"):
        summary = report[name] if name != "publish" else report["publish"]
        assert summary["samples"] == 3 and summary["p50_ms"] > 0
    assert set(report["console_where_region"]) == {"first_page", "next_page"}

"""The API described (docs/api.md): every body and every answer is a Pydantic model, so
/openapi.json is a contract a client can be generated from; /task-types says what can run."""

from __future__ import annotations

NON_JSON = {("get", "/metrics"), ("get", "/tasks/{task_id}/events")}  # text, SSE


async def test_openapi_has_a_body_schema_for_every_body_and_an_answer_for_every_2xx(stack):
    from importlib.metadata import version

    spec = (await stack.http.get("/openapi.json")).json()
    assert spec["info"]["version"] == version("artemis")  # the package's, not a made-up one
    takes_body = {
        ("post", "/tasks/{code}/run"),
        ("post", "/tasks/{task_id}/cancel"),
        ("post", "/tasks/{task_id}/pause"),
        ("post", "/tasks/{task_id}/rate-limit"),
        ("post", "/tasks/{task_id}/feedback"),
        ("post", "/notes/details"),
        ("post", "/registry/preview"),
    }
    schemas = spec["components"]["schemas"]
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            if (method, path) in takes_body:
                ref = op["requestBody"]["content"]["application/json"]["schema"]
                ref = ref.get("$ref") or next(
                    x["$ref"] for x in ref.get("anyOf", []) if "$ref" in x
                )
                assert ref.split("/")[-1] in schemas, (method, path, ref)
            if (method, path) in NON_JSON:
                continue
            two = {c: r for c, r in op["responses"].items() if c.startswith("2")}
            assert two, (method, path)
            for code, answer in two.items():
                schema = answer["content"]["application/json"]["schema"]
                assert "$ref" in schema, (method, path, code, schema)  # a named model
    run = schemas["RunBody"]["properties"]
    assert {"meta", "body", "params", "output"} <= set(run)
    assert set(schemas["RunMeta"]["properties"]) >= {"task_id", "run_id", "callback"}
    assert schemas["RateLimitBody"]["required"] == ["qps"]


async def test_task_types_list_each_code_with_its_params_schema(stack):
    listed = (await stack.http.get("/task-types")).json()["data"]
    by_code = {t["code"]: t for t in listed}
    assert {"pull_stock_quotes", "literature_harvest", "crawl_notes"} <= set(by_code)
    quotes = by_code["pull_stock_quotes"]
    # the quote API is named by the request or task_defaults: the library names none
    required = quotes["params_schema"]["required"]
    assert quotes["summary"] and required == ["symbols", "start", "base_url"], required
    lit = by_code["literature_harvest"]["params_schema"]["properties"]
    assert "provenance" in lit and "contract" not in lit  # internal params are not offered
    one = (await stack.http.get("/task-types/crawl_notes")).json()["data"]
    assert one["code"] == "crawl_notes" and "keywords" in one["params_schema"]["properties"]
    missing = await stack.http.get("/task-types/nope")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "TASK_NOT_FOUND"


async def test_docs_are_served_from_local_files(stack):
    page = await stack.http.get("/docs")
    assert page.status_code == 200
    assert "cdn" not in page.text.lower() and "https://" not in page.text
    assert "/docs/static/swagger-ui-bundle.js" in page.text
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css"):
        resp = await stack.http.get(f"/docs/static/{asset}")
        assert resp.status_code == 200 and len(resp.content) > 10_000, asset
    # Swagger UI renders OpenAPI 3.1 (what FastAPI writes) from its 5.x on; 4.x shows
    # "Unable to render this definition"
    import re

    spec = (await stack.http.get("/openapi.json")).json()
    bundle = (await stack.http.get("/docs/static/swagger-ui-bundle.js")).text
    (version,) = set(re.findall(r'PACKAGE_VERSION:"([0-9.]+)"', bundle))
    if spec["openapi"].startswith("3.1"):
        assert int(version.split(".")[0]) >= 5, version


async def test_the_task_view_lists_the_run_statuses_as_an_enum(stack):
    """A run's status is RunStatus in the contract (a client can switch on it), and the
    list filter takes the statuses task storage holds."""
    from artemis.run_state import RunStatus, StoredStatus

    spec = (await stack.http.get("/openapi.json")).json()
    schemas = spec["components"]["schemas"]
    status = schemas["TaskView"]["properties"]["status"]
    assert status == {"$ref": "#/components/schemas/RunStatus"}
    assert schemas["RunStatus"]["enum"] == [s.value for s in RunStatus]
    (param,) = [p for p in spec["paths"]["/tasks"]["get"]["parameters"] if p["name"] == "status"]
    ref = next(x["$ref"] for x in param["schema"]["anyOf"] if "$ref" in x)
    assert schemas[ref.split("/")[-1]]["enum"] == [s.value for s in StoredStatus]

"""The pages in a real headless Chromium (the distribution's, driven by Playwright; `make
install` puts it there) over the demo run: they render, a sample's highlighted sampled tokens
are exactly its loss_mask, and agent content holding markup shows as text."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from tests.viewer.conftest import ADMIN, PAYLOAD, RUN_ID, stored_samples


def chromium_path() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("no chromium on PATH: `make install` as root installs it (apt-get install chromium)")
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def page(browser, viewer) -> Iterator[Page]:
    """A signed-in page: every request carries the admin token."""
    context = browser.new_context(base_url=viewer, extra_http_headers={"Authorization": f"Bearer {ADMIN}"})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    yield page
    context.close()
    assert not errors, errors


def test_runs_run_step_and_sessions_pages_render(page, demo_run):
    page.goto("/#/")
    page.get_by_role("link", name=RUN_ID).click()
    page.wait_for_selector("#steps table")
    titles = page.locator("svg.chart .chart-title").all_text_contents()
    assert {"reward", "response length", "seconds per phase", "loss", "off-policy correction"} <= set(titles)
    correction = page.locator('svg.chart[aria-label="off-policy correction"]')
    assert correction.locator("circle.point").count() == 2 and "train/is_mask_fraction" in correction.text_content()
    assert page.locator("svg.chart circle.point").count() >= 4
    page.locator('svg.chart circle.point[data-step="1"]').first.click()  # a point on a chart -> its step
    page.wait_for_selector("div.group")
    assert page.locator("h1").text_content() == f"Run {RUN_ID} · step 1"
    assert "group g1" in page.locator("div.group h3").text_content()
    assert page.locator("span.split").count() == 1
    page.goto(f"/#/run/{RUN_ID}/sessions")
    page.wait_for_selector("text=Open sessions (1)")
    assert page.get_by_text(demo_run.open_session).count() == 1


def test_filters_narrow_a_step(page):
    page.goto(f"/#/run/{RUN_ID}/step/0")
    page.wait_for_selector("div.group")
    assert page.locator("div.group tbody tr").count() == 2
    page.fill("input[name=min_reward]", "0.9")
    page.click("form.filters button")
    page.wait_for_selector("main[data-ready*='min_reward=0.9']")  # the page drawn for the new filter
    assert page.locator("div.group tbody tr").count() == 1


def test_a_malformed_call_is_found_by_the_filter_and_shown_on_its_turn(page, demo_run):
    page.goto(f"/#/run/{RUN_ID}/samples")
    page.wait_for_selector("form.filters")
    page.fill("input[name=parse_failure]", "malformed")
    page.click("form.filters button")
    page.wait_for_selector("main[data-ready*='parse_failure=malformed']")
    rows = page.locator("table tbody tr")
    assert rows.count() == 1 and "malformed ×1" in rows.inner_text()
    rows.get_by_role("link", name=f"{demo_run.malformed_session}/0").click()
    page.wait_for_selector("#turns .parse-failure")
    assert page.locator("#turns .parse-failure").inner_text().startswith("tool call did not parse: malformed")


def test_highlighted_sampled_tokens_are_the_loss_mask(page, demo_run):
    for session_id, segment in ((demo_run.script_session, 0), (demo_run.split_session, 1)):
        stored = next(s for s in stored_samples(demo_run, session_id) if s.segment_index == segment)
        route = f"#/run/{RUN_ID}/sample/{session_id}/{segment}"
        page.goto(f"/{route}")
        page.wait_for_selector(f"main[data-ready='{route}']")  # this sample drawn, not the one before
        spans = page.locator("#turns .tok").evaluate_all(
            "spans => spans.map(s => [Number(s.dataset.i), s.classList.contains('sampled')])"
        )
        assert [i for i, _ in spans] == list(range(len(stored.tokens)))
        assert [int(sampled) for _, sampled in spans[stored.prompt_length :]] == stored.loss_mask
        assert not any(sampled for _, sampled in spans[: stored.prompt_length])
        title = page.locator("#turns .tok.sampled").first.get_attribute("title")
        assert "logprob" in title


def test_markup_in_agent_content_shows_as_text(page, demo_run):
    page.goto(f"/#/run/{RUN_ID}/sample/{demo_run.script_session}/0")
    page.wait_for_selector("#turns .tok")
    assert PAYLOAD in page.locator("#turns").inner_text()
    assert page.locator("main script, main img").count() == 0
    assert page.evaluate("window.__pwned") is None


def test_the_page_asks_for_the_admin_token(browser, viewer):
    context = browser.new_context(base_url=viewer)
    page = context.new_page()
    page.goto("/#/")
    page.fill("input[name=token]", "wrong")
    page.click("form.login button")
    page.wait_for_selector("text=wrong token")
    page.fill("input[name=token]", ADMIN)
    page.click("form.login button")
    page.get_by_role("link", name=RUN_ID).wait_for()
    context.close()


def test_a_harness_episode_shows_its_outcome_regenerations_and_patch(page, demo_run):
    page.goto(f"/#/run/{RUN_ID}/step/1")
    page.wait_for_selector("div.group")
    cell = page.locator("span.outcome")
    assert cell.count() == 1 and cell.get_attribute("title") == "killed at the agent timeout (60 s)"
    assert cell.text_content() == "fix-add-bug: agent_timeout · regenerated 1× (sandbox_failed)"
    page.goto(f"/#/run/{RUN_ID}/sample/{demo_run.split_session}/0")
    page.wait_for_selector("div.harness")
    facts = page.locator("div.harness dl").text_content()
    assert "agent_timeout" in facts and "sandbox_failed: the sandbox was removed" in facts
    page.locator("div.harness summary", has_text="patch").click()
    assert "+    return a + b" in page.locator("div.harness details[open] pre").text_content()

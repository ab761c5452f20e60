"""The web monitor in a real headless browser (Debian's chromium, driven by
Selenium through chromium-driver), on a study that ran; and its JSON state
while a study runs (``Tuner(monitor=True)``).

Needs ``apt-get install -y chromium chromium-driver`` (CI's set-up installs
them). Without them the browser test fails, naming the packages: a monitor
test silently skipped in CI checks nothing. ``RAY_STAGETREE_SKIP_BROWSER=1``
skips it deliberately, for machines that cannot install them.
"""

import contextlib
import io
import json
import os
import re
import shutil
import urllib.request

import pytest
from ray import tune

from ray_stagetree import MultiStep, Tuner
from ray_stagetree.monitor import serve

pytest.importorskip("flask")
pytest.importorskip("matplotlib")

HORIZON = 4
GAMMAS = (0.1, 0.5, 0.9)
# One root stage [0, 2) shared by the three trials, then one [2, 4) each.
STAGES = 1 + len(GAMMAS)


def get_json(url):
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.load(response)


class PeekAtTheMonitor(tune.Callback):
    """At the study's first result, reads the printed monitor URL and the live state it serves."""

    def __init__(self, printed):
        self.printed, self.url, self.live = printed, None, None

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if self.url is None:
            self.url = re.search(r"ray_stagetree monitor: (\S+)", self.printed.getvalue()).group(1)
            self.live = get_json(self.url + "api/state")


@pytest.fixture(scope="module")
def study(tmp_path_factory, ray_session):
    """A study run with Tuner(monitor=True): its results and what its monitor served while it ran."""
    from trainables_for_tests import noisy_descent

    printed = io.StringIO()
    peek = PeekAtTheMonitor(printed)
    with contextlib.redirect_stdout(printed):
        results = Tuner(
            noisy_descent,
            param_space={"lr": tune.grid_search([MultiStep(0.1, [2], gamma) for gamma in GAMMAS]), "sleep": 0.2},
            tune_config=tune.TuneConfig(metric="loss", mode="min"),
            run_config=tune.RunConfig(
                storage_path=str(tmp_path_factory.mktemp("monitor")),
                stop={"training_iteration": HORIZON},
                verbose=0,
                callbacks=[peek],
            ),
            monitor=True,
        ).fit()
    return results, peek


@pytest.fixture(scope="module")
def browser():
    if os.environ.get("RAY_STAGETREE_SKIP_BROWSER") == "1":
        pytest.skip("RAY_STAGETREE_SKIP_BROWSER=1")
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.fail(
            "the monitor's browser test needs Debian's chromium and chromedriver: apt-get install -y chromium chromium-driver"
        )
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1600"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the page's console, to check for errors
    # An explicit driver: Selenium Manager never looks for (or downloads) one.
    browser = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))
    yield browser
    browser.quit()


def test_page_shows_the_trials_curves_and_stage_tree_of_a_finished_study(study, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    finished_study = study[0]
    # No metric or mode given: the study's own (TuneConfig's), as `stagetree monitor PATH` serves it.
    with serve(finished_study.experiment_path, port=0, block=False) as server:
        browser.get(server.url)
        WebDriverWait(browser, 30).until(lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-loaded"))
        assert "loss min" in browser.find_element(By.ID, "trial-count").text

        rows = browser.find_elements(By.CSS_SELECTOR, "#trials tbody tr.trial")
        names = sorted(row.get_attribute("data-name") for row in rows)
        assert names == sorted(os.path.basename(result.path) for result in finished_study)
        assert {row.find_elements(By.TAG_NAME, "td")[1].text for row in rows} == {"TERMINATED"}
        # Best first (mode "min") by each trial's last result, as get_best_result ranks; the figures are the
        # results' own.
        last = [float(row.find_elements(By.TAG_NAME, "td")[3].text) for row in rows]
        assert last == sorted(last)
        assert rows[0].get_attribute("data-name") == os.path.basename(finished_study.get_best_result().path)
        # Clicking the column's header sorts the other way.
        browser.find_element(By.CSS_SELECTOR, "#trials th[data-key='latest']").click()
        rows = browser.find_elements(By.CSS_SELECTOR, "#trials tbody tr.trial")
        assert [float(row.find_elements(By.TAG_NAME, "td")[3].text) for row in rows] == sorted(last, reverse=True)

        stages = browser.find_elements(By.CSS_SELECTOR, "#tree .stage")
        assert len(stages) == STAGES
        assert {stage.get_attribute("class") for stage in stages} == {"stage finished"}
        ids = [stage.get_attribute("data-stage") for stage in stages]
        assert len(set(ids)) == STAGES  # no stage id names two stages
        root = browser.find_element(By.CSS_SELECTOR, "#tree > ul > li > .stage")
        assert root.text.startswith("H0:0-2 lr=0.1") and root.text.endswith(f"\u00d7{len(GAMMAS)}")
        assert len(browser.find_elements(By.CSS_SELECTOR, "#tree > ul > li > ul > li")) == len(GAMMAS)
        # The stage tree's picture: a labelled bar per stage (id, parameters, trials).
        bars = browser.find_elements(By.CSS_SELECTOR, "#plan g.plan-stage")
        assert sorted(bar.get_attribute("data-stage") for bar in bars) == sorted(ids)
        label = browser.find_element(By.CSS_SELECTOR, "#plan g.plan-stage[data-stage='H0:0-2'] title")
        assert label.get_attribute("textContent") == f"H0:0-2 lr=0.1 sleep=0.2 \u00d7{len(GAMMAS)}"

        sharing = browser.find_element(By.ID, "sharing").text
        executed, trial_by_trial = map(int, re.findall(r"(\d+) iterations executed, (\d+) trial by trial", sharing)[0])
        assert (executed, trial_by_trial) == (2 + len(GAMMAS) * 2, len(GAMMAS) * HORIZON)
        assert "partial" not in sharing  # the study ended

        check_the_figures(browser, ids, os.path.basename(finished_study.get_best_result().path))
        assert [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"] == []
        if os.environ.get("STAGETREE_MONITOR_SCREENSHOTS"):
            screenshots(browser, os.environ["STAGETREE_MONITOR_SCREENSHOTS"])


def check_the_figures(browser, stage_ids, best):
    """Best so far, importance, parallel coordinates, the curves the user picks
    and the worker timeline, each drawn with as many items as the study has."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def count(selector):
        return len(browser.find_elements(By.CSS_SELECTOR, selector))

    def the_one_curve_is(trial_name):
        """Whether the curve drawn is ``trial_name``'s, read again if the
        page redrew it meanwhile (a redraw replaces the element just found)."""
        try:
            WebDriverWait(browser, 10, ignored_exceptions=(StaleElementReferenceException,)).until(
                lambda b: (
                    b.find_element(By.CSS_SELECTOR, "#curves path.curve").get_attribute("data-trial") == trial_name
                )
            )
        except TimeoutException:
            return False
        return True

    state = browser.execute_script("return window.monitorState")
    # Best so far: a point per ended trial and the best-so-far line, by count or by wall time.
    assert count("#history circle.point") == len(GAMMAS) and count("#history path.best-line") == 1
    assert [point["count"] for point in state["history"]] == [1, 2, 3]
    assert state["history"][-1]["best"] == min(point["value"] for point in state["history"])
    browser.find_element(By.CSS_SELECTOR, "input[name='history-x'][value='at']").click()
    assert count("#history circle.point") == len(GAMMAS)
    assert "seconds since the first result" in browser.find_element(By.ID, "history").text
    # Parallel coordinates: MultiStep by its parameters (only gamma varies), then the metric's axis.
    axes = browser.find_elements(By.CSS_SELECTOR, "#parallel g.axis")
    assert [axis.get_attribute("data-name") for axis in axes] == ["lr.gamma", "loss"]
    assert count("#parallel path.pc-line") == len(GAMMAS)
    # Importance: one bar per hyper-parameter that varies, and the method named.
    assert [
        row.get_attribute("data-param") for row in browser.find_elements(By.CSS_SELECTOR, "#importance .imp-row")
    ] == ["lr.gamma"]
    assert "random-forest" in browser.find_element(By.ID, "importance-method").text
    # Curves: the best 5 (all 3 here), all, a selection clicked in the table, a log axis.
    curves = browser.find_element(By.ID, "curves")
    assert count("#curves path.curve") == len(GAMMAS)
    browser.find_element(By.CSS_SELECTOR, "#curve-best").clear()
    browser.find_element(By.CSS_SELECTOR, "#curve-best").send_keys("1\t")
    WebDriverWait(browser, 10).until(lambda b: curves.get_attribute("data-curves") == "1")
    assert the_one_curve_is(best), "the one curve drawn is not the best trial's"
    browser.find_element(By.CSS_SELECTOR, "input[name='curve-set'][value='all']").click()
    WebDriverWait(browser, 10).until(lambda b: curves.get_attribute("data-curves") == str(len(GAMMAS)))
    picked = browser.find_elements(By.CSS_SELECTOR, "#trials tbody tr.trial")[-1]
    name = picked.get_attribute("data-name")
    picked.click()
    WebDriverWait(browser, 10).until(lambda b: curves.get_attribute("data-curves") == "1")
    assert the_one_curve_is(name), "the one curve drawn is not the clicked trial's"
    assert "selected" in browser.find_element(By.CSS_SELECTOR, f"#trials tr[data-name='{name}']").get_attribute("class")
    browser.find_element(By.ID, "curve-log").click()
    WebDriverWait(browser, 10).until(lambda b: "log axis" in b.find_element(By.ID, "curves-count").text)
    assert count("#curves path.curve") == 1
    # The worker timeline: a lane per worker, a bar per stage a batch trained (every stage ran),
    # the checkpoints stored, a curve from where each batch started that forked or continued.
    timeline = state["timeline"]
    assert timeline["recorded"] and timeline["runs"]
    assert count("#timeline g.lane") == len(timeline["workers"]) >= 1
    assert count("#timeline rect.segment") == sum(len(run["segments"]) for run in timeline["runs"])
    # Read in one script: the page may redraw the timeline between two WebDriver calls (a stale element).
    segments = browser.execute_script(
        "return [...document.querySelectorAll('#timeline rect.segment')].map(r => r.getAttribute('data-stages'))"
    )
    drawn = {stage for stages in segments for stage in stages.split()}
    assert drawn == set(stage_ids)
    assert count("#timeline path.ckpt") == sum(len(run["checkpoints"]) for run in timeline["runs"]) >= 1
    # Each of the three branches starts from the root's stage: forked there, unless its batch trained the root too.
    assert count("#timeline path.fork") == sum(run["source"] is not None for run in timeline["runs"]) >= len(GAMMAS) - 1


def screenshots(browser, folder):
    """The page's views as PNGs (``STAGETREE_MONITOR_SCREENSHOTS=docs`` writes docs/monitor_*.png)."""
    from selenium.webdriver.common.by import By

    os.makedirs(folder, exist_ok=True)
    browser.find_element(By.ID, "curve-log").click()  # back to a linear axis
    browser.find_element(By.CSS_SELECTOR, "input[name='curve-set'][value='all']").click()
    browser.execute_script("window.scrollTo(0, 0)")
    for name, selector in {
        "history": "#history",
        "importance": "#importance",
        "parallel": "#parallel",
        "curves": "#curves",
        "timeline": "#timeline",
        "tree": "#plan",
    }.items():
        element = browser.find_element(By.CSS_SELECTOR, selector)
        section = element.find_element(By.XPATH, "ancestor::section[1]")
        section.screenshot(os.path.join(folder, f"monitor_{name}.png"))
    browser.save_screenshot(os.path.join(folder, "monitor_page.png"))


def test_a_running_study_serves_its_live_state_until_fit_returns(study):
    results, peek = study
    live = peek.live
    assert live["live"] and live["workers"] and live["metric"] == "loss"
    assert any("batch" in worker for worker in live["workers"])  # a worker is running a stage batch
    assert {stage["status"] for stage in live["stages"]} & {"running", "pending"}
    # Honest live numbers: RUNNING only for trials a worker holds; the sharing figures say they are partial;
    # each worker's stages by the tree's ids; the running batches on the timeline.
    held = {name for worker in live["workers"] for name in worker.get("trials", ())}
    assert {trial["name"] for trial in live["trials"] if trial["status"] == "RUNNING"} <= held
    assert live["sharing"]["partial"]
    ids = {stage["id"] for stage in live["stages"]}
    assert all(set(sum(worker["stages"], [])) <= ids for worker in live["workers"])
    assert any(run["outcome"] == "running" for run in live["timeline"]["runs"])
    assert len(results) == len(GAMMAS) and not results.errors
    with pytest.raises(OSError):  # fit() stopped the monitor when it returned
        get_json(peek.url + "api/state")

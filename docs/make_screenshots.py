"""Regenerate the monitor's pictures in docs/ from a real study.

Runs the MNIST-1D example's trainable on 21 trials (its 7 learning-rate
sequences x 3 batch-size sequences, 16 epochs), serves the monitor of the
finished study and photographs it in headless Chromium, the browser the
monitor's test drives (tests/monitor/test_monitor_browser.py): the top of
the page (monitor.png) and each view (monitor_<view>.png); then draws the
example spec's plan (plan_draw.png, `stagetree plan --draw`).

    python docs/make_screenshots.py        # a few minutes on 2 CPUs

Needs the examples and monitor extras, selenium, and Debian's chromium and
chromium-driver (``apt-get install -y chromium chromium-driver``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT / "examples"))

#: Each view's picture: the page's section holding this element (the stage tree: its picture, not the list under it).
VIEWS = {
    "history": "#history",
    "importance": "#importance",
    "curves": "#curves",
    "parallel": "#parallel",
    "timeline": "#timeline",
    "tree": "#plan",
}
WHOLE_SECTION = {"history", "importance", "curves", "parallel", "timeline"}
#: The page's picture (monitor.png): its top, as a browser window shows it.
WIDTH, HEIGHT = 1280, 1800
#: Pixels below which a view is not drawn yet.
MIN_HEIGHT = 100


def run_study(storage: str) -> str:
    """The study the pictures show; returns its experiment directory."""
    from mnist1d_study import EPOCHS, make_data, param_space, train_mnist1d
    from ray import tune

    from ray_stagetree import MultiStep, Tuner, init_ray

    # Ray's workers import the trainable's module by name: examples/ on their path too (a local Ray inherits it).
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "examples"), os.environ.get("PYTHONPATH")]))
    init_ray(include_dashboard=False)
    space = param_space()
    space["batch_size"] = tune.grid_search(
        [128, MultiStep(values=(128, 256), milestones=[8]), MultiStep(values=(64, 128), milestones=[4])]
    )
    results = Tuner(
        tune.with_parameters(train_mnist1d, data=make_data()),
        param_space=space,
        # Short trial names (Tune's default spells out the config, and the table's columns would not fit)
        tune_config=tune.TuneConfig(
            metric="accuracy", mode="max", trial_dirname_creator=lambda trial: f"train_mnist1d_{trial.trial_id}"
        ),
        run_config=tune.RunConfig(name="mnist1d_21_trials", storage_path=storage, stop={"training_iteration": EPOCHS}),
    ).fit()
    return results.experiment_path


def browser():
    from selenium import webdriver

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        sys.exit("needs Debian's chromium and chromedriver: apt-get install -y chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={WIDTH},{HEIGHT}"):
        options.add_argument(argument)
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))


def photograph(experiment_path: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from ray_stagetree.monitor import serve

    page = browser()
    try:
        with serve(experiment_path, port=0, block=False) as server:
            page.get(server.url)
            WebDriverWait(page, 60).until(lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-loaded"))
            page.save_screenshot(str(DOCS / "monitor.png"))
            for view, selector in VIEWS.items():
                element = page.find_element(By.CSS_SELECTOR, selector)
                if view in WHOLE_SECTION:
                    element = element.find_element(By.XPATH, "ancestor::section[1]")
                # the page redraws its views every 2 s: photograph one drawn, not one being redrawn
                WebDriverWait(page, 30).until(lambda _, drawn=element: drawn.size["height"] > MIN_HEIGHT)
                # a view the window shows only in part would be photographed in part
                page.execute_script("arguments[0].scrollIntoView()", element)
                element.screenshot(str(DOCS / f"monitor_{view}.png"))
    finally:
        page.quit()


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="stagetree_screenshots_") as storage:
        photograph(run_study(storage))
    plan = [sys.executable, "-m", "ray_stagetree.cli", "plan", "examples/mnist1d_study.yaml"]
    subprocess.run([*plan, "--draw", str(DOCS / "plan_draw.png")], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    print("wrote", ", ".join(["monitor.png", *(f"monitor_{view}.png" for view in VIEWS), "plan_draw.png"]))


if __name__ == "__main__":
    main()

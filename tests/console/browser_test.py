#!/usr/bin/env python3
"""The console in a real headless Chromium, as an operator uses it.

Starts console_demo_server (a slot-claiming gate on SQLite in a temp dir), then drives Chromium
through chromedriver: the console refuses a browser without the token; opened with the token it
drops the token from the address, shows the three signals and the manual queue; an operator opens
the row whose business write throws, enters an outcome and sees why nothing was committed; enters
an outcome that does not parse and is told so; resolves a timed-out row. The log (through the
JSON API) and the business table (the SQLite file) must then agree. Saves a screenshot.

Any failure, a Chromium that does not start included, fails the test: nothing is skipped.
"""

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

TOKEN = "browser-test-token-5f0c2a9e71d4b3c8"
PREFIX = "/ops/console"


def step(text):
    print("==>", text, flush=True)


def api(base, path, method="GET", body=None, token=TOKEN):
    request = urllib.request.Request(base + PREFIX + "/api/" + path, method=method)
    if token:
        request.add_header("Authorization", "Bearer " + token)
    if body is not None:
        request.data = json.dumps(body).encode()
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--server", required=True)
    parser.add_argument("--chromium", required=True)
    parser.add_argument("--chromedriver", required=True)
    parser.add_argument("--screenshot", required=True)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="idemgate-console-") as work:
        database = os.path.join(work, "console.db")
        server = subprocess.Popen([args.server, database, TOKEN], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        driver = None
        try:
            line = server.stdout.readline()
            check(line, "console_demo_server printed nothing (see its stderr above)")
            started = json.loads(line)
            base = "http://127.0.0.1:%d" % started["port"]
            keys = started["keys"]
            step("console_demo_server serves " + base + PREFIX + "/")

            options = webdriver.ChromeOptions()
            options.binary_location = args.chromium
            for flag in ("--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,1500",
                         "--user-data-dir=" + os.path.join(work, "profile")):
                options.add_argument(flag)
            options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
            driver = webdriver.Chrome(service=Service(args.chromedriver), options=options)
            wait = WebDriverWait(driver, 20)

            def settled():
                # No reload of the page's lists is running: their elements are the final ones.
                wait.until(lambda d: d.find_element(By.TAG_NAME, "body")
                           .get_attribute("data-loaded") == "yes")
            step("Chromium " + driver.capabilities.get("browserVersion", "?") + " started")

            step("without the token the console serves nothing")
            driver.get(base + PREFIX + "/")
            check("The console needs its token" in driver.page_source,
                  "expected the 401 problem, got: " + driver.page_source[:500])
            check(not driver.find_elements(By.ID, "signals"), "the page was served without token")

            step("opened with the token, the token leaves the address bar")
            driver.get(base + PREFIX + "/?token=" + TOKEN)
            settled()
            check(driver.current_url == base + PREFIX + "/", "the address still holds the token: "
                  + driver.current_url)
            cookies = driver.get_cookies()
            check(len(cookies) == 1 and cookies[0]["httpOnly"] and cookies[0]["sameSite"] ==
                  "Strict" and TOKEN not in cookies[0]["value"], "the session cookie: %r" % cookies)

            step("the three signals and the manual queue")
            check(driver.find_element(By.ID, "gate").text == "console.claim_slot",
                  "the gate's name")
            for card in ("signal-duplicates", "signal-in-flight", "signal-mismatches"):
                text = driver.find_element(By.ID, card).text
                check("OK" in text or "ALARM" in text, card + " shows no state: " + text)
            check("%" in driver.find_element(By.ID, "signal-duplicates").text, "duplicate ratio")
            check(not driver.find_element(By.ID, "signal-snapshot").is_displayed(),
                  "an open-transaction card on a store that cannot tell (SQLite)")
            queued = [row.get_attribute("data-key")
                      for row in driver.find_elements(By.CSS_SELECTOR, "#queue-rows tr")]
            escalated = [keys["TIMEOUT-HLXU8001231"], keys["BROKEN-TCLU3309876"],
                         keys["TIMEOUT-SEGU5501770"]]
            check(sorted(queued) == sorted(escalated), "the queue: %r" % queued)

            step("the causes, a cause's rows with their labels, and re-driving a cause")
            causes = driver.find_elements(By.CSS_SELECTOR, "#cause-rows tr")
            check(len(causes) == 3, "causes: %r" % [c.text for c in causes])
            failed = [c for c in causes if c.text.startswith("failed")]
            check(len(failed) == 1 and "REFUSED-XXXU0000000" in failed[0].text,
                  "the failed cause: %r" % [c.text for c in causes])
            failed[0].find_element(By.CSS_SELECTOR, "button.show-cause").click()
            wait.until(lambda d: d.find_element(By.ID, "cause-list").is_displayed())
            listed = driver.find_element(By.ID, "cause-list-rows").text
            check("console.claim_slot event-6 REFUSED-XXXU0000000" in listed,
                  "the cause's rows show no label: " + listed)
            check("console.claim_slot event-5 BROKEN-TCLU3309876" in
                  driver.find_element(By.ID, "queue-rows").text, "the queue shows no label")
            failed[0].find_element(By.CSS_SELECTOR, "button.redrive-cause").click()
            wait.until(lambda d: d.find_element(By.ID, "page-done").is_displayed())
            check("1 failed row(s) re-driven" in driver.find_element(By.ID, "page-done").text,
                  "the re-drive's answer")
            settled()
            status, row = api(base, "rows/" + keys["REFUSED-XXXU0000000"])
            check(status == 200 and row["status"] == "in_flight", "re-driven row: %r" % row)
            wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#cause-rows tr")) == 2)

            def open_row(container):
                driver.find_element(
                    By.CSS_SELECTOR, "#queue-rows tr[data-key='%s'] button.open" %
                    keys[container]).click()
                wait.until(lambda d: d.find_element(By.ID, "row-key").text == keys[container])
                check(driver.find_element(By.ID, "row-request").text == container,
                      "the row's request")
                check(driver.find_element(By.ID, "row-status").text == "escalated",
                      "the row's status")

            def resolve(outcome):
                box = driver.find_element(By.ID, "outcome")
                box.clear()
                box.send_keys(outcome)
                driver.find_element(By.ID, "resolve").click()
                wait.until(lambda d: d.find_element(By.ID, "row-problem").is_displayed() or
                           d.find_element(By.ID, "row-done").is_displayed())
                settled()

            step("resolving the row whose business write throws: nothing committed, and why")
            open_row("BROKEN-TCLU3309876")
            check("no booking line" in driver.find_element(By.ID, "row-fields").text,
                  "the row's reason")
            history = driver.find_element(By.ID, "row-history").text
            check("escalated" in history and "no booking line" in history,
                  "the row's history: " + history)
            resolve('{"slot": "ECTD-MANUAL-1"}')
            problem = driver.find_element(By.ID, "row-problem").text
            check("nothing was committed" in problem and "create it in the TMS first" in problem
                  and "still escalated" in problem, "the error shown: " + problem)
            check(driver.find_element(By.ID, "row-status").text == "escalated", "status after")

            step("an outcome that does not parse is refused")
            open_row("TIMEOUT-HLXU8001231")
            resolve("ECTD-MANUAL-2")
            problem = driver.find_element(By.ID, "row-problem").text
            check("does not parse" in problem and '{"slot": "<slot id>"}' in problem,
                  "the error shown: " + problem)

            step("resolving a timed-out row commits the outcome and the business row")
            resolve('{"slot": "ECTD-MANUAL-2"}')
            check(driver.find_element(By.ID, "row-done").is_displayed(),
                  "no confirmation: " + driver.find_element(By.ID, "row-problem").text)
            wait.until(ec.text_to_be_present_in_element((By.ID, "row-status"), "committed"))
            wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#queue-rows tr")) == 2)
            driver.execute_script("window.scrollTo(0, 0)")
            driver.save_screenshot(args.screenshot)
            step("screenshot saved as " + args.screenshot)

            step("any row opens by its key")
            box = driver.find_element(By.ID, "open-key")
            box.send_keys(keys["REFUSED-XXXU0000000"])
            box.submit()
            wait.until(lambda d: d.find_element(By.ID, "row-key").text ==
                       keys["REFUSED-XXXU0000000"])
            check(driver.find_element(By.ID, "row-status").text == "in_flight",
                  "the re-driven row's status")
            check("redriven" in driver.find_element(By.ID, "row-history").text,
                  "the re-driven row's history")

            errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"
                      and "Content Security Policy" in entry["message"]]
            check(not errors, "the page broke its own Content-Security-Policy: %r" % errors)

            step("the log and the business table agree")
            status, row = api(base, "rows/" + keys["TIMEOUT-HLXU8001231"])
            check(status == 200 and row["status"] == "committed" and
                  json.loads(row["result"]) == {"slot": "ECTD-MANUAL-2"}, "the row: %r" % row)
            status, row = api(base, "rows/" + keys["BROKEN-TCLU3309876"])
            check(status == 200 and row["status"] == "escalated", "the broken row: %r" % row)
            status, problem = api(base, "signals", token=None)
            check(status == 401, "the API answered without a token")
            db = sqlite3.connect(database)
            try:
                booked = dict(db.execute(
                    "SELECT container, slot FROM bookings WHERE container IN (?, ?)",
                    ("TIMEOUT-HLXU8001231", "BROKEN-TCLU3309876")).fetchall())
            finally:
                db.close()
            check(booked == {"TIMEOUT-HLXU8001231": "ECTD-MANUAL-2"}, "bookings: %r" % booked)
            step("passed")
        finally:
            if driver is not None:
                driver.quit()
            server.stdin.close()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


if __name__ == "__main__":
    try:
        main()
    except Exception as error:  # the test fails, never skips
        print("FAILED:", type(error).__name__, error, file=sys.stderr, flush=True)
        sys.exit(1)

// Uses the chat page in a real headless Chromium (the system's, driven by puppeteer-core
// over the DevTools protocol): sends a prompt, waits until two tool cards run at once,
// lets their tools finish (POST /test/release), approves the third call, and reads the
// final answer, the cards and the cost. argv: the page's URL and where to save a
// screenshot of the finished page. Prints one JSON object.
import { statSync } from "node:fs";
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

const prefix = process.env.AGENTLOOP_TEST_NPM_PREFIX;
const need = async (name) =>
  import(pathToFileURL(createRequire(`${prefix}/node_modules/`).resolve(name)).href);
const puppeteer = (await need("puppeteer-core")).default;

const [url, screenshot] = process.argv.slice(2);
const browser = await puppeteer.launch({
  executablePath: process.env.AGENTLOOP_TEST_CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
const seen = {};
try {
  const page = await browser.newPage();
  const problems = [];
  page.on("pageerror", (error) => problems.push(String(error)));
  page.on("requestfailed", (request) => problems.push(`failed: ${request.url()}`));
  const loaded = [];
  page.on("request", (request) => loaded.push(request.url()));
  await page.setViewport({ width: 1100, height: 760 });
  await page.goto(url, { waitUntil: "load" });

  await page.type("#prompt", "Weather in Paris and Rome, and refund order B2");
  await page.click("#send");

  // both weather calls are running at once: their tools wait until we have seen it
  await page.waitForFunction(
    () => document.querySelectorAll('.card[data-tool="get_weather"][data-status="running"]').length === 2,
    { timeout: 20000 },
  );
  seen.runningTogether = await page.$$eval('.card[data-status="running"]', (cards) =>
    cards.map((c) => c.querySelector(".input").textContent),
  );
  await fetch(new URL("test/release", url), { method: "POST" });

  // the card waits as soon as the approval is requested; the page waits once the run has
  // ended on it (its stream closed): a moment later
  await page.waitForSelector('.card[data-status="waiting"] button.approve', { timeout: 20000 });
  await page.waitForFunction(() => document.getElementById("status").dataset.status !== "running", {
    timeout: 20000,
  });
  seen.waiting = await page.$eval('.card[data-status="waiting"]', (card) => ({
    tool: card.dataset.tool,
    reason: card.querySelector(".reason").textContent,
    statusBar: document.getElementById("status").dataset.status,
    buttonsShown: [...document.querySelectorAll("button.approve, button.deny")].filter(
      (b) => b.checkVisibility(),
    ).length,
  }));
  await page.click('.card[data-status="waiting"] button.approve');

  await page.waitForFunction(
    () =>
      document.getElementById("status").dataset.status === "idle" &&
      [...document.querySelectorAll(".assistant")].some((b) => b.textContent.includes("refunded")),
    { timeout: 20000 },
  );
  seen.answer = await page.$$eval(".assistant", (bubbles) => bubbles.map((b) => b.textContent));
  seen.cards = await page.$$eval(".card", (cards) =>
    cards.map((c) => ({
      tool: c.dataset.tool,
      status: c.dataset.status,
      state: c.querySelector(".state").textContent,
      result: c.querySelector(".result").textContent,
    })),
  );
  seen.buttonsShown = await page.$$eval("button.approve, button.deny", (buttons) =>
    buttons.filter((b) => b.checkVisibility()).length,
  );
  seen.cost = await page.$eval("#cost", (e) => e.textContent);
  seen.tokens = await page.$eval("#tokens", (e) => e.textContent);
  seen.error = await page.$eval("#error", (e) => (e.hidden ? null : e.textContent));
  seen.problems = problems;
  seen.loaded = loaded;
  await page.screenshot({ path: screenshot, fullPage: true });
  seen.screenshotBytes = statSync(screenshot).size;
} finally {
  await browser.close();
}
console.log(JSON.stringify(seen));

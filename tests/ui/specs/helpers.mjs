// Shared by the specs: the seeded data, sign-in, the accessibility check, screenshots.
import fs from "node:fs";
import path from "node:path";
import { expect } from "@playwright/test";
import AxeBuilder from "@axe-core/playwright";

const here = path.dirname(new URL(import.meta.url).pathname);

export function seeded() {
  return JSON.parse(fs.readFileSync(path.join(here, "..", ".stack", "seed.json"), "utf8"));
}

export const operatorToken = () => process.env.RAILHOOK_UI_OPERATOR_TOKEN;
export const receiver = () => process.env.RAILHOOK_UI_RECEIVER;

/** A link of the dashboard's main navigation. */
export const nav = (page, name) => page.getByRole("navigation", { name: "Sections" }).getByRole("link", { name, exact: true });

/** Signs in through the form, as a person would: label, typing, Enter. */
export async function signIn(page, credential) {
  await page.goto("/ui/");
  await expect(page).toHaveURL(/\/ui\/sign-in$/);
  await page.getByLabel("Project API key or operator token").fill(credential);
  await page.getByLabel("Project API key or operator token").press("Enter");
}

/** axe-core over the page (WCAG 2 A and AA rules): no serious or critical violation. */
export async function expectAccessible(page) {
  const results = await new AxeBuilder({ page }).withTags(["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]).analyze();
  const serious = results.violations.filter((v) => v.impact === "serious" || v.impact === "critical");
  const summary = serious.map((v) => `${v.id} (${v.impact}): ${v.nodes.map((n) => n.target.join(" ")).join(", ")}`);
  expect(summary, "axe-core violations").toEqual([]);
}

/** A full-page screenshot kept as an artifact in docs/screenshots/. */
export async function screenshot(page, name) {
  const dir = process.env.RAILHOOK_UI_SCREENSHOTS || path.join(here, "..", "screenshots");
  fs.mkdirSync(dir, { recursive: true });
  await page.screenshot({ path: path.join(dir, `${name}.png`), fullPage: true });
}

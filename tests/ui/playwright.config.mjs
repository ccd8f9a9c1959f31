// Playwright for the dashboard: Debian's Chromium (no browser download), one worker (the
// flows share the stack that ./run started), screenshots on failure.
import { defineConfig } from "@playwright/test";

export default defineConfig({
  testDir: "./specs",
  globalSetup: "./seed.mjs",
  workers: 1,
  fullyParallel: false,
  timeout: 60_000,
  expect: { timeout: 15_000 },
  reporter: [["list"]],
  use: {
    baseURL: process.env.RAILHOOK_UI_BASE,
    headless: true,
    viewport: { width: 1280, height: 860 },
    screenshot: "only-on-failure",
    launchOptions: {
      executablePath: process.env.CHROMIUM_PATH || "/usr/bin/chromium",
      // Root in CI containers: Chromium's sandbox needs a user namespace it may not get.
      args: ["--no-sandbox"],
    },
  },
});

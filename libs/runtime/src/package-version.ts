import { readFileSync } from "node:fs";

/**
 * The `version` of the package.json at `manifest` (a package finds its own with
 * `new URL("../package.json", import.meta.url)`, beside `src/` and `dist/`); `"unknown"` when it
 * cannot be read.
 */
export function packageVersion(manifest: URL): string {
  try {
    const parsed = JSON.parse(readFileSync(manifest, "utf8")) as { version?: unknown };
    return typeof parsed.version === "string" ? parsed.version : "unknown";
  } catch {
    return "unknown";
  }
}

import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { z } from "zod";
import { wireSchemas } from "./wire-schemas.js";

// Writes schemas/<name>.json at the repo root from the zod definitions, or with --check
// fails when a checked-in file differs from what the definitions generate.
const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const outDir = join(root, "schemas");
const check = process.argv.includes("--check");
const stale: string[] = [];

mkdirSync(outDir, { recursive: true });
for (const [name, schema] of Object.entries(wireSchemas)) {
  const json = z.toJSONSchema(schema, { target: "draft-2020-12", io: "input" });
  const text = `${JSON.stringify({ $id: `urn:toolmesh:schema:v1:${name}`, ...json }, null, 2)}\n`;
  const file = join(outDir, `${name}.json`);
  if (check) {
    let current = "";
    try {
      current = readFileSync(file, "utf8");
    } catch {
      // A missing file is stale.
    }
    if (current !== text) stale.push(file);
  } else {
    writeFileSync(file, text);
  }
}

if (stale.length > 0) {
  process.stderr.write(`stale JSON Schemas (run "npm run schemas"):\n  ${stale.join("\n  ")}\n`);
  process.exit(1);
}
process.stdout.write(
  check
    ? "JSON Schemas are up to date\n"
    : `wrote ${Object.keys(wireSchemas).length} JSON Schemas to ${outDir}\n`,
);

import { mkdir, writeFile } from "node:fs/promises";
import { basename, dirname, join, relative, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import type { Command } from "commander";
import { stringify as toYaml } from "yaml";
import type { OpenApiSourceFile, OpenApiTools } from "@toolmesh/executor";
import { issuesLine } from "@toolmesh/protocol";
import type { RuntimeConfig } from "@toolmesh/runtime";
import { say } from "./print.js";
import { commaList } from "./comma-list.js";

/** Options of `toolmesh tools import-openapi`. */
export interface ImportOpenApiOptions {
  prefix?: string;
  includeTags?: string[];
  excludeTags?: string[];
  baseUrl?: string;
  dryRun?: boolean;
  json?: boolean;
}

/** Adds `tools import-openapi SPEC` under the `tools` command. */
export function addImportOpenApiCommand(
  tools: Command,
  config: () => RuntimeConfig,
  run: (command: () => Promise<number>) => void,
): void {
  tools
    .command("import-openapi")
    .description(
      "serve an OpenAPI document's operations as tools: write a source file into TOOLMESH_NATIVE_TOOLS_DIR, then print them and what cannot be served",
    )
    .argument("<spec>", "the OpenAPI 3.x document: a file or an http(s) URL")
    .option("--prefix <prefix>", "tool names are PREFIX.operationId (default: from the file name)")
    .option(
      "--include-tags <tags>",
      "only operations with one of these tags (comma-separated)",
      commaList,
    )
    .option("--exclude-tags <tags>", "leave out operations with one of these tags", commaList)
    .option("--base-url <url>", "base URL of the API instead of the document's first server")
    .option("--dry-run", "print the tools and warnings; write nothing")
    .option("--json", "print JSON")
    .action((spec: string, o: ImportOpenApiOptions, command: Command) => {
      // `--prefix` is also the global subject-prefix option, which takes it wherever it is
      // written; here it names the tools, and this command never uses the subject prefix.
      const { prefix } = command.optsWithGlobals<{ prefix?: string }>();
      run(() =>
        importOpenApiCommand(config(), spec, { ...o, ...(prefix === undefined ? {} : { prefix }) }),
      );
    });
}

/**
 * `toolmesh tools import-openapi`: reads the document as an executor would, prints each tool
 * (name, method and path, summary) and a warning for each part it cannot serve, and — unless
 * `dryRun` — writes `PREFIX.openapi.yaml` (the document's location and the options) into the
 * HTTP tools folder, where executors load it at their next start. Never overwrites a file.
 */
export async function importOpenApiCommand(
  config: RuntimeConfig,
  spec: string,
  o: ImportOpenApiOptions,
): Promise<number> {
  const prefix = o.prefix ?? prefixOf(spec);
  const remote = /^https?:\/\//i.test(spec);
  const source: OpenApiSourceFile = {
    // A file is named relative to the folder the source file goes to, as executors read it.
    spec: remote ? spec : relative(resolve(config.nativeToolsDir), resolve(spec)),
    prefix,
    ...(o.baseUrl === undefined ? {} : { server: o.baseUrl }),
    ...(o.includeTags === undefined ? {} : { include: { tags: o.includeTags } }),
    ...(o.excludeTags === undefined ? {} : { exclude: { tags: o.excludeTags } }),
  };
  // Loaded here, not with the CLI: only this command needs them.
  const { OpenApiSourceFileSchema, ToolLoadError, openApiTools, readOpenApiDocument } =
    await import("@toolmesh/executor");
  const { outboundFetch, trustedHostsOf } = await import("@toolmesh/tool-host");
  const parsed = OpenApiSourceFileSchema.safeParse(source);
  if (!parsed.success) {
    throw new ToolLoadError(`invalid options: ${issuesLine(parsed.error)}`);
  }
  // The document's URL is the operator's own, as an executor trusts it in the written file.
  const fetch = outboundFetch(
    config.allowPrivateAddresses,
    remote ? trustedHostsOf(spec, undefined, config.trustConfiguredHosts) : [],
  );
  const document = await readOpenApiDocument(spec, fetch);
  const result = openApiTools(document, {
    options: parsed.data,
    location: remote ? spec : pathToFileURL(resolve(spec)).href,
    // Secrets are configured in the written file; the import itself needs none.
    env: {},
    fetch,
    ...(config.nativeAllowedUrls === undefined ? {} : { allowedUrls: config.nativeAllowedUrls }),
  });
  const file = join(config.nativeToolsDir, `${prefix}.openapi.yaml`);
  if (o.dryRun !== true) await writeSourceFile(file, source);
  printImport(result, file, o);
  return 0;
}

/** Writes the source file executors load, making its folder if needed; never over an existing one. */
async function writeSourceFile(file: string, source: OpenApiSourceFile): Promise<void> {
  const { ToolLoadError } = await import("@toolmesh/executor");
  try {
    await mkdir(dirname(file), { recursive: true });
    await writeFile(file, toYaml(source), { flag: "wx" });
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    throw new ToolLoadError(
      code === "EEXIST"
        ? `${file} exists already; choose another --prefix or remove it`
        : `cannot write ${file}: ${(err as Error).message}`,
      { cause: err },
    );
  }
}

/** Prints the tools imported, a warning for each part not served, and what was written. */
function printImport(result: OpenApiTools, file: string, o: ImportOpenApiOptions): void {
  if (o.json === true) {
    say(
      JSON.stringify({
        tools: result.tools.map((t) => ({
          name: t.name,
          summary: t.summary ?? null,
          groups: t.groups ?? [],
          origin: t.origin,
          parameters: t.parameters,
        })),
        warnings: result.warnings,
        operations: result.operations,
        ...(o.dryRun === true ? {} : { written: file }),
      }),
    );
    return;
  }
  for (const t of result.tools) {
    const origin = t.origin as { method: string; path: string };
    say(
      `${t.name}  ${origin.method} ${origin.path}${t.summary === undefined ? "" : `  ${t.summary}`}`,
    );
  }
  for (const w of result.warnings) {
    process.stderr.write(
      `toolmesh: warning: ${w.tool === undefined ? "" : `${w.tool}: `}${w.message}\n`,
    );
  }
  say(
    `${result.tools.length} tools from ${result.operations} operations, ${result.warnings.length} warnings; ${
      o.dryRun === true ? "dry run, nothing written" : `wrote ${file}`
    }`,
  );
}

/** `specs/petstore.openapi.yaml` → `petstore`; a URL's last path segment likewise. */
function prefixOf(spec: string): string {
  const last = basename(/^https?:\/\//i.test(spec) ? new URL(spec).pathname : spec);
  const stem = last.replace(/\.(?:ya?ml|json)$/i, "").replace(/\.openapi$/i, "");
  return stem.replace(/[^A-Za-z0-9_-]+/g, "_") || "api";
}

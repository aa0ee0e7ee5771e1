import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it, vi } from "vitest";
import type { Mock } from "vitest";
import { stringify as toYaml } from "yaml";
import { RetryableError, TerminalError, ToolmeshError } from "@toolmesh/protocol";
import { toolDefinitionOf } from "@toolmesh/tool-host/internal";
import { ToolLoadError } from "./load-tools.js";
import type { LoadLog } from "./tool-source.js";
import { retryAfterMs } from "@toolmesh/tool-host/internal";
import { loadNativeToolsDir } from "./native-tools.js";
import type { NativeToolFile, NativeToolsOptions } from "./native-tools.js";
import type { ToolContext, ToolModule } from "@toolmesh/tool-host";

const SECRET = "s3cret-native-key";
const ENV = { WEATHER_API_KEY: SECRET };
const dirs: string[] = [];

afterAll(async () => {
  await Promise.all(dirs.map((dir) => rm(dir, { recursive: true, force: true })));
});

/** A fresh folder holding `files` (name → YAML text or a tool file to serialise). */
async function nativeDir(files: Record<string, string | NativeToolFile>): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "toolmesh-native-tools-"));
  dirs.push(dir);
  for (const [name, content] of Object.entries(files)) {
    await writeFile(join(dir, name), typeof content === "string" ? content : toYaml(content));
  }
  return dir;
}

function weather(extra: Partial<NativeToolFile> = {}): NativeToolFile {
  return {
    name: "weather",
    description: "Forecast for a city.",
    parameters: {
      type: "object",
      properties: {
        city: { type: "string" },
        days: { type: "integer" },
        trace: { type: "string" },
        note: { type: "string" },
      },
      required: ["city"],
    },
    api_url: "http://api.test/v1/{city}/forecast",
    ...extra,
  };
}

function fakeLog(): LoadLog & { warn: Mock<(obj: object, msg: string) => void> } {
  return { warn: vi.fn<(obj: object, msg: string) => void>() };
}

interface Sent {
  url: string;
  method: string;
  headers: Record<string, string>;
  body: string | undefined;
}

/** A fetch answering with `answers` in turn (the last one repeats) and recording requests. */
function fakeFetch(...answers: (() => Response | Promise<Response>)[]): {
  fetch: typeof globalThis.fetch;
  sent: Sent[];
} {
  const sent: Sent[] = [];
  const fetch = (async (input: string | URL | Request, init?: RequestInit) => {
    sent.push({
      url: input instanceof Request ? input.url : input.toString(),
      method: init?.method ?? "GET",
      headers: Object.fromEntries(new Headers(init?.headers).entries()),
      body: typeof init?.body === "string" ? init.body : undefined,
    });
    const answer = answers[Math.min(sent.length - 1, answers.length - 1)];
    if (answer === undefined) throw new Error("no answer");
    return answer();
  }) as typeof globalThis.fetch;
  return { fetch, sent };
}

function ctx(signal = new AbortController().signal): ToolContext {
  return {
    callId: "c1",
    idempotencyKey: "s1/c1",
    sessionId: "s1",
    tool: "weather",
    attempt: 1,
    context: {},
    signal,
    deadlineAt: Date.now() + 60_000,
    emit: () => undefined,
    log: { debug: () => undefined } as unknown as ToolContext["log"],
  };
}

async function loadOne(
  file: NativeToolFile,
  options: NativeToolsOptions = {},
  env: Record<string, string> = ENV,
): Promise<ToolModule> {
  const tools = await loadNativeToolsDir(
    await nativeDir({ "tool.yaml": file }),
    env,
    fakeLog(),
    options,
  );
  expect(tools).toHaveLength(1);
  return tools[0] as ToolModule;
}

async function loadError(
  files: Record<string, string | NativeToolFile>,
  options: NativeToolsOptions = {},
  env: Record<string, string> = ENV,
): Promise<ToolLoadError> {
  const err: unknown = await loadNativeToolsDir(
    await nativeDir(files),
    env,
    fakeLog(),
    options,
  ).then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ToolLoadError);
  return err as ToolLoadError;
}

async function failure(promise: unknown): Promise<ToolmeshError> {
  const err: unknown = await Promise.resolve(promise).then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ToolmeshError);
  return err as ToolmeshError;
}

const json = (value: unknown, init: ResponseInit = {}): Response =>
  new Response(JSON.stringify(value), {
    ...init,
    headers: { "content-type": "application/json; charset=utf-8", ...init.headers },
  });

describe("loadNativeToolsDir", () => {
  it("loads .yaml and .yml files in name order as native modules, ignoring other files", async () => {
    const dir = await nativeDir({
      "b.yml": weather({ name: "b_tool" }),
      "a.yaml": weather({ name: "a_tool", method: "post", timeout_ms: 2_000, groups: ["web"] }),
      "notes.txt": "not a tool",
    });
    const tools = await loadNativeToolsDir(dir, ENV, fakeLog());
    expect(tools.map((t) => t.name)).toEqual(["a_tool", "b_tool"]);
    expect(tools[0]).toMatchObject({
      kind: "native",
      timeoutMs: 2_000,
      groups: ["web"],
      origin: { api_url: "http://api.test/v1/{city}/forecast", method: "POST" },
    });
  });

  it("keeps the first of a repeated name, also against names already taken, and warns", async () => {
    const dir = await nativeDir({
      "1.yaml": weather(),
      "2.yaml": weather({ description: "the second" }),
      "3.yaml": weather({ name: "echo" }),
    });
    const log = fakeLog();
    const tools = await loadNativeToolsDir(dir, ENV, log, {
      taken: new Map([["echo", "/tools/builtin/echo.js"]]),
    });
    expect(tools.map((t) => [t.name, t.description])).toEqual([
      ["weather", "Forecast for a city."],
    ]);
    expect(log.warn).toHaveBeenCalledTimes(2);
    expect(log.warn).toHaveBeenCalledWith(
      { tool: "echo", kept: "/tools/builtin/echo.js", skipped: join(dir, "3.yaml") },
      "duplicate tool name; the first one wins",
    );
  });

  it("treats a missing folder as no tools only when told to", async () => {
    const missing = join(tmpdir(), "toolmesh-native-missing-folder");
    expect(await loadNativeToolsDir(missing, ENV, fakeLog(), { missingOk: true })).toEqual([]);
    await expect(loadNativeToolsDir(missing, ENV, fakeLog())).rejects.toThrow(
      /cannot read native tools folder/,
    );
  });

  it.each([
    ["YAML that does not parse", "name: [unclosed", /bad\.yaml is not a readable YAML file/],
    ["an empty file", "", /bad\.yaml is not a native tool/],
    ["a missing api_url", { name: "x", description: "" }, /api_url/],
    ["an unknown field", { ...weather(), auth_method: "api_key" }, /auth_method/],
    ["an unknown method", weather({ method: "TRACE" }), /method/],
    ["a bad placement", weather({ placement: { days: "cookie" as "query" } }), /placement/],
    ["a bad header name", weather({ placement: { trace: { header: "X Trace" } } }), /header/],
    ["a non-http URL", weather({ api_url: "ftp://api.test/x" }), /http:\/\/ or https:\/\//],
    ["a placeholder in the host", weather({ api_url: "http://{city}.api.test/" }), /host/],
    ["credentials in the URL", weather({ api_url: "http://u:p@api.test/{city}" }), /credentials/],
    ["an unknown placeholder", weather({ api_url: "http://api.test/{town}" }), /\{town\}/],
    [
      "a placeholder placed elsewhere",
      weather({ placement: { city: "query" } }),
      /placement\.city: an api_url placeholder/,
    ],
    ["a path param with no placeholder", weather({ placement: { days: "path" } }), /\{days\}/],
    ["a placement of an unknown param", weather({ placement: { dayz: "query" } }), /dayz/],
    ["a body for GET", weather({ placement: { note: "body" } }), /GET request has no body/],
    ["a retry typo", weather({ retry: { max_attempt: 2 } as never }), /max_attempt/],
  ])("fails on %s, naming the file", async (_, content, message) => {
    const err = await loadError({ "ok.yaml": weather({ name: "ok" }), "bad.yaml": content });
    expect(err.message).toContain("bad.yaml");
    expect(err.message).toMatch(message);
  });

  it("fails naming the variable when an auth secret is not in the environment", async () => {
    const file = weather({ auth: { method: "api_key", env: "WEATHER_API_KEY" } });
    const err = await loadError({ "w.yaml": file }, {}, { OTHER: "x" });
    expect(err.message).toMatch(/w\.yaml: auth needs the environment variable WEATHER_API_KEY/);
    await expect(loadOne(file, {}, { WEATHER_API_KEY: "" })).rejects.toThrow(/WEATHER_API_KEY/);
  });

  it("refuses an api_url outside the allowed prefixes", async () => {
    const file = weather({ api_url: "http://api.test/v1/{city}" });
    await loadOne(file, { allowedUrls: ["http://api.test/v1"] });
    await loadOne(file, { allowedUrls: ["http://other.test/", "http://api.test/"] });
    for (const allowed of [
      "http://api.test/v2",
      "http://api.test/v",
      "https://api.test/",
      "http://api.test:81/",
    ]) {
      const err = await loadError({ "w.yaml": file }, { allowedUrls: [allowed] });
      expect(err.message).toMatch(/outside TOOLMESH_NATIVE_ALLOWED_URLS/);
    }
  });

  it("keeps the secret out of the module and its registry entry", async () => {
    const tool = await loadOne(
      weather({ auth: { method: "bearer", env: "WEATHER_API_KEY" }, presets: { days: 2 } }),
    );
    const definition = toolDefinitionOf(tool, "executor");
    expect(JSON.stringify({ ...tool, handler: undefined })).not.toContain(SECRET);
    expect(JSON.stringify(definition)).not.toContain(SECRET);
    expect(definition).toMatchObject({
      kind: "native",
      preset_params: ["days"],
      origin: { api_url: "http://api.test/v1/{city}/forecast", method: "GET" },
    });
  });

  it("loads the example in examples/native", async () => {
    const examples = join(dirname(fileURLToPath(import.meta.url)), "../../../examples/native");
    const tools = await loadNativeToolsDir(examples, ENV, fakeLog(), {
      allowedUrls: ["http://127.0.0.1:8089/v1/"],
    });
    expect(tools.map((t) => t.name)).toEqual(["forecast"]);
  });
});

describe("a native tool's handler", () => {
  it("places path, query, header and body params and sends the credential", async () => {
    const { fetch, sent } = fakeFetch(() => json({ ok: true }));
    const tool = await loadOne(
      weather({
        method: "PUT",
        placement: { days: "query", trace: { header: "X-Trace" }, note: "body" },
        auth: { method: "api_key", env: "WEATHER_API_KEY" },
        presets: { city: "Zürich/Nord" },
      }),
      { fetch },
    );
    // The model cannot replace the credential through a header param.
    const args = { city: "Zürich/Nord", days: 3, trace: "t-1", note: "n", extra: [1] };
    expect(await tool.handler(args, ctx())).toEqual({ ok: true });
    expect(sent).toHaveLength(1);
    const [request] = sent;
    expect(request?.method).toBe("PUT");
    expect(request?.url).toBe("http://api.test/v1/Z%C3%BCrich%2FNord/forecast?days=3");
    expect(request?.headers).toMatchObject({
      "x-trace": "t-1",
      "x-api-key": SECRET,
      "content-type": "application/json",
      "idempotency-key": "s1/c1",
    });
    expect(JSON.parse(request?.body ?? "")).toEqual({ note: "n", extra: [1] });
  });

  it("defaults to query for GET (arrays repeated) and sends a bearer token", async () => {
    const { fetch, sent } = fakeFetch(() => new Response("sunny"));
    const tool = await loadOne(
      weather({
        api_url: "http://api.test/v1/{city}?fixed=1",
        auth: { method: "bearer", env: "WEATHER_API_KEY" },
      }),
      { fetch },
    );
    expect(
      await tool.handler({ city: "Oslo", days: 2, note: ["a", "b"], trace: null }, ctx()),
    ).toBe("sunny");
    expect(sent[0]?.url).toBe("http://api.test/v1/Oslo?fixed=1&days=2&note=a&note=b");
    expect(sent[0]?.headers.authorization).toBe(`Bearer ${SECRET}`);
    expect(sent[0]?.headers["idempotency-key"]).toBeUndefined();
    expect(sent[0]?.body).toBeUndefined();
  });

  it("refuses path values that would leave the path, and a missing path value", async () => {
    const { fetch, sent } = fakeFetch(() => json({}));
    const tool = await loadOne(weather(), { fetch });
    for (const city of ["..", ".", ""]) {
      const err = await failure(tool.handler({ city }, ctx()));
      expect(err).toMatchObject({ code: "invalid_parameters", retryable: false });
    }
    const err = await failure(tool.handler({ days: 1 }, ctx()));
    expect(err.message).toMatch(/"city" is required/);
    expect(sent).toHaveLength(0);
  });

  it("returns JSON as parsed JSON and anything else as text", async () => {
    const answers = [
      () => json({ temp: 21 }),
      () =>
        new Response('{"not":"json content type"}', { headers: { "content-type": "text/plain" } }),
      () => new Response('"a string"', { headers: { "content-type": "application/problem+json" } }),
      () => new Response("{broken", { headers: { "content-type": "application/json" } }),
      () => new Response(null, { status: 204 }),
    ];
    const { fetch } = fakeFetch(...answers);
    const tool = await loadOne(weather(), { fetch });
    const results = [];
    for (let i = 0; i < answers.length; i++) results.push(await tool.handler({ city: "x" }, ctx()));
    expect(results).toEqual([
      { temp: 21 },
      '{"not":"json content type"}',
      '"a string"',
      "{broken",
      "",
    ]);
  });

  it("makes 429 and 5xx retryable, honouring Retry-After", async () => {
    const { fetch } = fakeFetch(
      () => new Response("slow down", { status: 429, headers: { "retry-after": "2" } }),
      () => new Response("down", { status: 503 }),
    );
    const tool = await loadOne(weather(), { fetch });
    const limited = await failure(tool.handler({ city: "x" }, ctx()));
    expect(limited).toBeInstanceOf(RetryableError);
    expect(limited).toMatchObject({
      code: "tool_error",
      retryable: true,
      retryAfterMs: 2_000,
      details: { status: 429, body: "slow down", retry_after_ms: 2_000 },
    });
    const down = await failure(tool.handler({ city: "x" }, ctx()));
    expect(down).toMatchObject({ retryable: true, retryAfterMs: undefined });
    expect(down.details).toEqual({ status: 503, body: "down" });
  });

  it("makes other 4xx terminal with the status and a bounded body, the secret redacted", async () => {
    const { fetch } = fakeFetch(
      () => new Response(`no such city; key ${SECRET} ${"x".repeat(10_000)}`, { status: 404 }),
    );
    const tool = await loadOne(weather({ auth: { method: "api_key", env: "WEATHER_API_KEY" } }), {
      fetch,
    });
    const err = await failure(tool.handler({ city: "x" }, ctx()));
    expect(err).toBeInstanceOf(TerminalError);
    expect(err).toMatchObject({ code: "tool_error", retryable: false });
    expect(err.details?.status).toBe(404);
    expect(err.details?.body_truncated).toBe(true);
    expect((err.details?.body as string).length).toBeLessThanOrEqual(4096);
    expect(err.details?.body).toContain("no such city; key [redacted]");
    expect(JSON.stringify(err.toWire())).not.toContain(SECRET);
  });

  it("turns a network failure into a retryable unavailable", async () => {
    const refused = Object.assign(new TypeError("fetch failed"), {
      cause: Object.assign(new Error("connect ECONNREFUSED"), { code: "ECONNREFUSED" }),
    });
    const { fetch } = fakeFetch(() => Promise.reject(refused));
    const tool = await loadOne(weather(), { fetch });
    const err = await failure(tool.handler({ city: "x" }, ctx()));
    expect(err).toMatchObject({
      code: "unavailable",
      retryable: true,
      details: { origin: "http://api.test", reason: "ECONNREFUSED" },
    });
  });

  it("passes the attempt's signal and lets the executor report an abort", async () => {
    const controller = new AbortController();
    let seen: AbortSignal | undefined;
    const fetch = ((_: unknown, init?: RequestInit) => {
      seen = init?.signal ?? undefined;
      return new Promise<Response>((_resolve, reject) => {
        init?.signal?.addEventListener("abort", () => reject(init.signal?.reason as Error));
      });
    }) as typeof globalThis.fetch;
    const tool = await loadOne(weather(), { fetch });
    const pending = Promise.resolve(tool.handler({ city: "x" }, ctx(controller.signal)));
    const reason = new ToolmeshError("timeout", "attempt timed out");
    controller.abort(reason);
    await expect(pending).rejects.toBe(reason);
    expect(seen).toBe(controller.signal);
  });

  it("keeps every request URL under the allowed prefix", async () => {
    const { fetch, sent } = fakeFetch(() => json({}));
    const tool = await loadOne(weather({ api_url: "http://api.test/v1/{city}" }), {
      fetch,
      allowedUrls: ["http://api.test/v1/"],
    });
    await tool.handler({ city: "%2e%2e" }, ctx()); // encoded, so not a parent segment
    await tool.handler({ city: "../../admin" }, ctx());
    expect(sent.map((s) => s.url)).toEqual([
      "http://api.test/v1/%252e%252e",
      "http://api.test/v1/..%2F..%2Fadmin",
    ]);
    const err = await failure(tool.handler({ city: ".." }, ctx()));
    expect(err).toMatchObject({ code: "invalid_parameters" });
    expect(sent).toHaveLength(2);
  });

  it("follows redirects within the allow-list and drops the credential across origins", async () => {
    const { fetch, sent } = fakeFetch(
      () => new Response(null, { status: 307, headers: { location: "/v1/moved" } }),
      () => new Response(null, { status: 302, headers: { location: "http://mirror.test/v1/x" } }),
      () => json({ moved: true }),
    );
    const tool = await loadOne(weather({ auth: { method: "api_key", env: "WEATHER_API_KEY" } }), {
      fetch,
    });
    expect(await tool.handler({ city: "x" }, ctx())).toEqual({ moved: true });
    expect(sent.map((s) => [s.url, s.headers["x-api-key"]])).toEqual([
      ["http://api.test/v1/x/forecast", SECRET],
      ["http://api.test/v1/moved", SECRET],
      ["http://mirror.test/v1/x", undefined],
    ]);

    const { fetch: fetch2 } = fakeFetch(
      () => new Response(null, { status: 302, headers: { location: "http://evil.test/" } }),
    );
    const guarded = await loadOne(weather(), { fetch: fetch2, allowedUrls: ["http://api.test/"] });
    const err = await failure(guarded.handler({ city: "x" }, ctx()));
    expect(err).toMatchObject({ code: "permission_denied", retryable: false });
  });

  it("refuses a success body larger than the limit", async () => {
    const { fetch } = fakeFetch(() => new Response("x".repeat(100)));
    const tool = await loadOne(weather(), { fetch, maxResponseBytes: 50 });
    const err = await failure(tool.handler({ city: "x" }, ctx()));
    expect(err).toMatchObject({ code: "payload_too_large", retryable: false });
  });
});

describe("retryAfterMs", () => {
  it("reads delay-seconds and HTTP dates", () => {
    const now = Date.parse("2025-01-01T00:00:00Z");
    expect(retryAfterMs("3", now)).toBe(3_000);
    expect(retryAfterMs(" 0 ", now)).toBe(0);
    expect(retryAfterMs("Wed, 01 Jan 2025 00:00:05 GMT", now)).toBe(5_000);
    expect(retryAfterMs("Tue, 31 Dec 2024 23:00:00 GMT", now)).toBe(0);
    expect(retryAfterMs("soon", now)).toBeUndefined();
    expect(retryAfterMs(null, now)).toBeUndefined();
  });
});

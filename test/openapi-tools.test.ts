import { readFile, mkdtemp, rm, writeFile } from "node:fs/promises";
import type { IncomingMessage, ServerResponse } from "node:http";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { stringify as toYaml } from "yaml";
import type { OpenApiSourceFile, ToolContext, ToolModule } from "@toolmesh/executor";
import type { ToolSourceSettings } from "@toolmesh/executor/internal";
import {
  OpenApiSourceFileSchema,
  ToolLoadError,
  openApiTools,
  readOpenApiDocument,
} from "@toolmesh/executor";
import { openApiToolSources } from "@toolmesh/executor/internal";
import { ToolmeshError } from "@toolmesh/protocol";
import { runCli } from "./helpers/cli.js";
import { startHttpApi } from "./helpers/http-api.js";
import type { HttpApi } from "./helpers/http-api.js";

// OpenAPI documents as tools, against a real HTTP server this test starts. The documents are
// the published examples of @readme/oas-examples (MIT, ReadMe) and GitHub's REST API
// description from @octokit/openapi (MIT, GitHub), both devDependencies: served over HTTP by
// the test server, or read from node_modules.

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const EXAMPLES = join(ROOT, "node_modules", "@readme", "oas-examples");
const GITHUB = join(
  ROOT,
  "node_modules",
  "@octokit",
  "openapi",
  "generated",
  "api.github.com.json",
);
const CLIENT_ID = "toolmesh-client";
const CLIENT_SECRET = "client-secret-7d1e";

interface Echo {
  method: string;
  path: string;
  query: string;
  headers: Record<string, string | string[] | undefined>;
  body: unknown;
}

let api: HttpApi;
let base: string;
let dir: string;
let tokenRequests = 0;
/** Where the API's `/v2/moved` redirects to. */
let movedTo = "http://127.0.0.1:9/";
/** What the API received last, before any redaction of what it answered. */
let received: Echo | undefined;
const warnings: { obj: object; msg: string }[] = [];
const log = { warn: (obj: object, msg: string) => warnings.push({ obj, msg }) };

function answer(req: IncomingMessage, res: ServerResponse, body: string): void {
  const url = new URL(req.url ?? "/", "http://localhost");
  const json = (status: number, value: unknown): void => {
    res.writeHead(status, { "content-type": "application/json" });
    res.end(JSON.stringify(value));
  };
  if (url.pathname.startsWith("/specs/")) {
    // A published document, served as an API team would serve it.
    readFile(join(EXAMPLES, url.pathname.slice("/specs/".length)), "utf8").then(
      (text) => {
        res.writeHead(200, { "content-type": "application/json" });
        res.end(text);
      },
      () => json(404, { error: "no such document" }),
    );
    return;
  }
  if (url.pathname === "/oauth/token") {
    tokenRequests++;
    const expected = `Basic ${Buffer.from(`${CLIENT_ID}:${CLIENT_SECRET}`).toString("base64")}`;
    const form = new URLSearchParams(body);
    if (req.headers.authorization !== expected || form.get("grant_type") !== "client_credentials") {
      json(401, { error: "invalid_client" });
      return;
    }
    json(200, { access_token: `token-${tokenRequests}`, token_type: "Bearer", expires_in: 3600 });
    return;
  }
  if (url.pathname === "/v2/moved") {
    res.writeHead(302, { location: movedTo });
    res.end();
    return;
  }
  if (url.pathname === "/v2/pet/404") {
    json(404, { code: 1, type: "error", message: "Pet not found" });
    return;
  }
  if (url.pathname === "/v2/pet/500") {
    res.writeHead(500, { "content-type": "text/plain" });
    res.end("database is down");
    return;
  }
  const echo: Echo = {
    method: req.method ?? "",
    path: (req.url ?? "/").split("?")[0] ?? "",
    query: url.search,
    headers: req.headers,
    body: body === "" ? null : (JSON.parse(body) as unknown),
  };
  received = echo;
  json(200, echo);
}

function ctx(tool = "t"): ToolContext {
  return {
    callId: "c1",
    idempotencyKey: "tenant/session/key-1",
    sessionId: "s1",
    tool,
    attempt: 1,
    context: {},
    signal: new AbortController().signal,
    deadlineAt: Date.now() + 60_000,
    emit: () => undefined,
    log: { debug: () => undefined } as unknown as ToolContext["log"],
  };
}

function settings(extra: Partial<ToolSourceSettings> = {}): ToolSourceSettings {
  return {
    toolsDir: dir,
    nativeToolsDir: dir,
    nativeToolsDirOptional: false,
    env: {},
    allowPrivateAddresses: ["127.0.0.1"],
    ...extra,
  };
}

/** Loads the OpenAPI sources of a fresh folder holding `files`. */
async function load(
  files: Record<string, OpenApiSourceFile | string>,
  extra: Partial<ToolSourceSettings> = {},
): Promise<Map<string, ToolModule>> {
  dir = await mkdtemp(join(tmpdir(), "toolmesh-openapi-"));
  for (const [name, content] of Object.entries(files)) {
    await writeFile(join(dir, name), typeof content === "string" ? content : toYaml(content));
  }
  const s = settings(extra);
  const tools = new Map<string, ToolModule>();
  for (const source of await openApiToolSources.discover(s, log)) {
    for (const t of await source.load()) tools.set(t.name, t);
  }
  return tools;
}

async function invoke(tool: ToolModule | undefined, args: Record<string, unknown>): Promise<Echo> {
  expect(tool).toBeDefined();
  return (await tool!.handler(args, ctx(tool!.name))) as Echo;
}

async function failure(result: unknown): Promise<ToolmeshError> {
  try {
    await result;
  } catch (err) {
    if (err instanceof ToolmeshError) return err;
    throw err;
  }
  throw new Error("expected the call to fail");
}

beforeAll(async () => {
  api = await startHttpApi(answer);
  base = api.url;
});

afterAll(async () => {
  await api?.close();
  if (dir !== undefined) await rm(dir, { recursive: true, force: true });
});

describe("an OpenAPI document as a tool source", () => {
  it("serves the petstore by URL: references resolved, parameters and body placed, errors typed", async () => {
    const tools = await load(
      {
        "petstore.openapi.yaml": {
          spec: `${base}/specs/3.0/json/petstore.json`,
          server: `${base}/v2`,
          auth: { api_key: { env: "PETSTORE_KEY" } },
          timeout_ms: 5000,
          retry: { max_attempts: 4, initial_backoff_ms: 100 },
        },
      },
      { env: { PETSTORE_KEY: "pet-key-0001" } },
    );
    expect(tools.size).toBe(20);
    const addPet = tools.get("petstore.addPet");
    // requestBodies/Pet → schemas/Pet → schemas/Category and schemas/Tag, all resolved.
    expect(addPet?.parameters).toMatchObject({
      type: "object",
      required: ["name", "photoUrls"],
      properties: {
        name: { type: "string", example: "doggie" },
        category: { type: "object", properties: { id: { type: "integer" } } },
        tags: { type: "array", items: { type: "object" } },
        status: { enum: ["available", "pending", "sold"] },
      },
    });
    expect(JSON.stringify(addPet?.parameters)).not.toContain("$ref");
    expect(addPet).toMatchObject({
      kind: "native",
      groups: ["petstore.pet"],
      summary: "Add a new pet to the store",
      annotations: { readOnlyHint: false },
      timeoutMs: 5000,
      // POST is not idempotent: attempted once unless retry_non_idempotent.
      retry: { max_attempts: 1, initial_backoff_ms: 100 },
      origin: { operation_id: "addPet", method: "POST", path: "/pet" },
    });
    expect(tools.get("petstore.getPetById")).toMatchObject({
      annotations: { readOnlyHint: true },
    });
    expect(tools.get("petstore.getPetById")?.retry).toMatchObject({
      max_attempts: 4,
      initial_backoff_ms: 100,
    });

    const created = await invoke(addPet, { name: "Rex", photoUrls: ["a.png"], status: "sold" });
    expect(created).toMatchObject({
      method: "POST",
      path: "/v2/pet",
      body: { name: "Rex", photoUrls: ["a.png"], status: "sold" },
    });
    expect(created.headers["content-type"]).toBe("application/json");
    expect(created.headers["idempotency-key"]).toBe("tenant/session/key-1");

    // Path parameter, the API key from the environment in its header.
    const got = await invoke(tools.get("petstore.getPetById"), { petId: 7 });
    expect(got).toMatchObject({ method: "GET", path: "/v2/pet/7" });
    expect(received?.headers.api_key).toBe("pet-key-0001");
    // An API echoing the secret back does not carry it into the result.
    expect(got.headers.api_key).toBe("[redacted]");

    // Query array, exploded (form style by default).
    const found = await invoke(tools.get("petstore.findPetsByStatus"), {
      status: ["available", "sold"],
    });
    expect(found.query).toBe("?status=available&status=sold");

    // Header parameter and path parameter together; a GET-less DELETE has no body.
    const deleted = await invoke(tools.get("petstore.deletePet"), { petId: 3 });
    expect(deleted).toMatchObject({ method: "DELETE", path: "/v2/pet/3", body: null });

    const missing = await failure(tools.get("petstore.getPetById")!.handler({ petId: 404 }, ctx()));
    expect(missing).toMatchObject({
      code: "tool_error",
      retryable: false,
      details: { status: 404, body: '{"code":1,"type":"error","message":"Pet not found"}' },
    });
    const down = await failure(tools.get("petstore.getPetById")!.handler({ petId: 500 }, ctx()));
    expect(down).toMatchObject({
      code: "tool_error",
      retryable: true,
      details: { status: 500, body: "database is down" },
    });
  });

  it("serialises parameters of every location by their style", async () => {
    const tools = await load({
      "style.openapi.yaml": {
        spec: join(EXAMPLES, "3.0", "json", "parameters-style.json"),
        server: base,
      },
    });
    const cookies = await invoke(tools.get("style.cookies_form_nonExploded"), {
      primitive: "x y",
      array: ["a", "b"],
    });
    expect(cookies.headers.cookie).toBe("primitive=x%20y; array=a%2Cb");
    const headers = await invoke(tools.get("style.headers_simple_exploded"), {
      primitive: "p",
      array: [1, 2],
      object: { role: "admin", first: "Alex" },
    });
    expect(headers.headers).toMatchObject({
      primitive: "p",
      array: "1,2",
      object: "role=admin,first=Alex",
    });
    const label = await invoke(tools.get("style.paths_label_exploded"), {
      primitive: "p",
      array: ["a", "b"],
      object: { k: "v" },
    });
    expect(label.path).toBe("/anything/path/label/.p/.a.b/.k=v");
    const matrix = await invoke(tools.get("style.paths_matrix_nonExploded"), {
      primitive: "p",
      array: ["a", "b"],
      object: { k: "v" },
    });
    expect(matrix.path).toBe("/anything/path/matrix/;primitive=p/;array=a,b/;object=k,v");
    const deep = await invoke(tools.get("style.query_deepObject_nonExploded"), {
      object: { role: "admin", first: "Alex" },
    });
    expect(decodeURIComponent(deep.query)).toBe("?object[role]=admin&object[first]=Alex");
    const pipes = await invoke(tools.get("style.query_pipeDelimited_nonExploded"), {
      array: ["a", "b"],
    });
    expect(decodeURIComponent(pipes.query)).toBe("?array=a|b");
  });

  it("fills every supported security scheme from secrets, never from the arguments", async () => {
    tokenRequests = 0;
    const env = {
      KEY: "key-value-1234",
      USER: "alice",
      PASS: "pass-word-99",
      BEARER: "bearer-token-42",
      CLIENT_ID,
      CLIENT_SECRET,
    };
    const tools = await load(
      {
        "sec.openapi.yaml": {
          spec: join(EXAMPLES, "3.0", "json", "security.json"),
          server: base,
          auth: {
            apiKey_query: { env: "KEY" },
            apiKey_cookie: { env: "KEY" },
            apiKey_header: { env: "KEY" },
            basic: { username_env: "USER", password_env: "PASS" },
            bearer: { env: "BEARER" },
            oauth2_clientCredentials: {
              client_id_env: "CLIENT_ID",
              client_secret_env: "CLIENT_SECRET",
              token_url: `${base}/oauth/token`,
              scopes: ["write:things"],
            },
          },
        },
      },
      { env },
    );
    const byPath = (path: string, method: string): ToolModule | undefined =>
      [...tools.values()].find(
        (t) =>
          (t.origin as { path: string }).path === path &&
          (t.origin as { method: string }).method === method,
      );
    await invoke(byPath("/anything/apiKey", "GET"), {});
    expect(received?.query).toBe("?apiKey=key-value-1234");
    await invoke(byPath("/anything/apiKey", "POST"), {});
    expect(received?.headers.cookie).toBe("api_key=key-value-1234");
    await invoke(byPath("/anything/apiKey", "PUT"), {});
    expect(received?.headers["x-api-key"]).toBe("key-value-1234");
    await invoke(byPath("/anything/basic", "POST"), {});
    expect(received?.headers.authorization).toBe(
      `Basic ${Buffer.from("alice:pass-word-99").toString("base64")}`,
    );
    const bearer = await invoke(byPath("/anything/bearer", "POST"), {});
    expect(received?.headers.authorization).toBe("Bearer bearer-token-42");
    expect(bearer.headers.authorization).toBe("Bearer [redacted]");
    // Optional security ({} among the alternatives): the key is sent since it is configured.
    await invoke(byPath("/anything/optional-auth", "GET"), {});
    expect(received?.query).toBe("?apiKey=key-value-1234");
    await invoke(byPath("/anything/no-auth", "POST"), {});
    expect(received?.headers.authorization).toBeUndefined();
    const oauthTool = byPath("/anything/oauth2", "PUT");
    await invoke(oauthTool, {});
    expect(received?.headers.authorization).toBe("Bearer token-1");
    await invoke(oauthTool, {});
    expect(received?.headers.authorization).toBe("Bearer token-1");
    expect(tokenRequests).toBe(1); // cached until shortly before it expires
    // The model cannot replace a credential: a header argument of the same name loses.
    expect(JSON.stringify([...tools.values()].map((t) => t.parameters))).not.toContain(
      "key-value-1234",
    );
    // Schemes it cannot fill are named in a warning.
    expect(warnings.map((w) => w.msg)).toContainEqual(
      expect.stringContaining("security scheme openIdConnect: type openIdConnect is not supported"),
    );
  });

  it("refuses an OAuth2 client whose credentials the token endpoint rejects", async () => {
    const tools = await load(
      {
        "sec.openapi.yaml": {
          spec: join(EXAMPLES, "3.0", "json", "security.json"),
          server: base,
          include: { operations: ["put_anything_oauth2"] },
          auth: {
            oauth2_clientCredentials: {
              client_id_env: "CLIENT_ID",
              client_secret_env: "CLIENT_SECRET",
              token_url: `${base}/oauth/token`,
            },
          },
        },
      },
      { env: { CLIENT_ID, CLIENT_SECRET: "wrong-secret" } },
    );
    const [tool] = [...tools.values()];
    const err = await failure(tool!.handler({}, ctx()));
    expect(err).toMatchObject({ code: "permission_denied", retryable: false });
    expect(JSON.stringify(err.details)).not.toContain("wrong-secret");
  });

  it("leaves readOnly properties out of the input", async () => {
    const tools = await load({
      "vis.openapi.yaml": {
        spec: join(EXAMPLES, "3.0", "json", "schema-visibility.json"),
        server: base,
      },
    });
    const schemas = JSON.stringify([...tools.values()].map((t) => t.parameters));
    expect(schemas).toContain("propWithWriteOnly");
    expect(schemas).not.toContain("propWithReadOnly");
  });

  it("takes the server of the operation, its path or the document, with its variables", async () => {
    const tools = await load({
      "sv.openapi.yaml": {
        spec: join(EXAMPLES, "3.0", "json", "server-variables.json"),
        server_variables: { name: "acme", subpath: "x" },
      },
    });
    const servers = Object.fromEntries(
      [...tools.values()].map((t) => {
        const o = t.origin as { method: string; path: string; server: string };
        return [`${o.method} ${o.path}`, o.server];
      }),
    );
    expect(servers).toMatchObject({
      "POST /global": "https://acme.example.com/v2",
      "POST /operation": "https://httpbin.com/anything/x",
      "PUT /combo": "https://httpbin.com/anything/x",
    });
    expect(Object.values(servers)).toContain("https://httpbin.com/anything/common/x");
  });

  it("keeps operations by tag, operationId and method", async () => {
    const source = (include?: object, exclude?: object): OpenApiSourceFile => ({
      spec: join(EXAMPLES, "3.0", "json", "petstore.json"),
      server: base,
      ...(include === undefined ? {} : { include }),
      ...(exclude === undefined ? {} : { exclude }),
    });
    const names = async (s: OpenApiSourceFile): Promise<string[]> =>
      [...(await load({ "p.openapi.yaml": s })).keys()].sort();
    expect(await names(source({ tags: ["store"] }))).toEqual([
      "p.deleteOrder",
      "p.getInventory",
      "p.getOrderById",
      "p.placeOrder",
    ]);
    expect(await names(source({ tags: ["store"], methods: ["get"] }))).toEqual([
      "p.getInventory",
      "p.getOrderById",
    ]);
    expect(
      await names(source(undefined, { tags: ["pet", "user"], operations: ["placeOrder"] })),
    ).toEqual(["p.deleteOrder", "p.getInventory", "p.getOrderById"]);
  });

  it("warns for each part it cannot serve and refuses what it cannot read", async () => {
    const doc = async (file: string): Promise<string[]> => {
      const result = openApiTools(
        await readOpenApiDocument(join(EXAMPLES, "3.0", "json", file), fetch),
        {
          options: OpenApiSourceFileSchema.parse({ spec: file, prefix: "x", server: base }),
          location: file,
          env: {},
          fetch,
        },
      );
      return result.warnings.map((w) => `${w.tool ?? "-"}: ${w.message}`);
    };
    expect(await doc("file-uploads.json")).toEqual(
      expect.arrayContaining([
        "x.post_anything_multipart_formdata: the request body is multipart/form-data, which is not supported (JSON only); the operation is served without a body",
        "x.post_anything_image_png: the request body is image/png, which is not supported (JSON only); the operation is served without a body",
      ]),
    );
    expect(await doc("callbacks.json")).toContain(
      "x.post_streams: callbacks are not served; the operation is, without them",
    );
    expect(await doc("schema-circular.json")).toContainEqual(
      expect.stringContaining("refers to itself; below that point any JSON value is accepted"),
    );
    await expect(
      readOpenApiDocument(join(EXAMPLES, "2.0", "json", "petstore.json"), fetch),
    ).rejects.toThrow(/is a Swagger 2.0 document; convert it to OpenAPI 3 first/);
    await expect(
      load({
        "bad.openapi.yaml": { spec: "petstore.json", prefix: "bad", nonsense: true } as never,
      }),
    ).rejects.toThrow(ToolLoadError);
    await expect(
      load({
        "sec.openapi.yaml": {
          spec: join(EXAMPLES, "3.0", "json", "security.json"),
          server: base,
          auth: { bearer: { env: "NOT_SET_ANYWHERE" } },
        },
      }),
    ).rejects.toThrow(/needs the environment variable NOT_SET_ANYWHERE, which is not set/);
  });

  it("applies the outbound guard to the document and to every call when configured hosts are not trusted", async () => {
    await expect(
      load(
        {
          "p.openapi.yaml": { spec: `${base}/specs/3.0/json/petstore.json`, server: `${base}/v2` },
        },
        { allowPrivateAddresses: [], trustConfiguredHosts: false },
      ),
    ).rejects.toThrow(/is a loopback address/);
    const tools = await load(
      {
        "p.openapi.yaml": {
          spec: join(EXAMPLES, "3.0", "json", "petstore.json"),
          server: `${base}/v2`,
        },
      },
      { allowPrivateAddresses: [], trustConfiguredHosts: false },
    );
    const err = await failure(tools.get("p.getPetById")!.handler({ petId: 1 }, ctx()));
    expect(err).toMatchObject({
      code: "permission_denied",
      details: { reason: "private_address" },
    });
    await expect(
      load(
        {
          "p.openapi.yaml": {
            spec: join(EXAMPLES, "3.0", "json", "petstore.json"),
            server: `${base}/v2`,
          },
        },
        { allowedUrls: ["https://api.example.com/"] },
      ),
    ).rejects.toThrow(/outside TOOLMESH_NATIVE_ALLOWED_URLS/);
  });

  it("trusts the exact host of the configured spec and base URL, overridable both ways", async () => {
    const source = (trust?: boolean): OpenApiSourceFile => ({
      spec: `${base}/specs/3.0/json/petstore.json`,
      server: `${base}/v2`,
      ...(trust === undefined ? {} : { trust_configured_host: trust }),
    });
    // Loopback is refused (no TOOLMESH_ALLOW_PRIVATE_ADDRESSES), but the operator wrote this host.
    const tools = await load({ "p.openapi.yaml": source() }, { allowPrivateAddresses: [] });
    expect(await invoke(tools.get("p.getPetById"), { petId: 1 })).toMatchObject({
      method: "GET",
      path: "/v2/pet/1",
    });
    await expect(
      load({ "p.openapi.yaml": source(false) }, { allowPrivateAddresses: [] }),
    ).rejects.toThrow(/is a loopback address/);
    await expect(
      load(
        { "p.openapi.yaml": source() },
        { allowPrivateAddresses: [], trustConfiguredHosts: false },
      ),
    ).rejects.toThrow(/is a loopback address/);
    const again = await load(
      { "p.openapi.yaml": source(true) },
      { allowPrivateAddresses: [], trustConfiguredHosts: false },
    );
    expect(await invoke(again.get("p.getPetById"), { petId: 2 })).toMatchObject({
      path: "/v2/pet/2",
    });
  });

  it("trusts a document server's host as filled at load: no argument moves it, a redirect elsewhere is refused", async () => {
    // Another private host:port (same address, other port) that nothing configured.
    let reached = 0;
    const other = await startHttpApi((_req, res) => {
      reached++;
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ secret: "internal data" }));
    });
    const otherPort = new URL(other.url).port;
    movedTo = `http://127.0.0.1:${otherPort}/v2/pet/1`;
    try {
      const apiPort = new URL(base).port;
      const document = {
        openapi: "3.0.3",
        info: { title: "variables", version: "1" },
        // The port is a server variable: its default fills it at load, never an argument.
        servers: [{ url: "http://127.0.0.1:{port}/v2", variables: { port: { default: apiPort } } }],
        paths: {
          "/pet/{petId}": {
            get: {
              operationId: "getPet",
              parameters: [
                { name: "petId", in: "path", required: true, schema: { type: "string" } },
                { name: "port", in: "query", schema: { type: "string" } },
              ],
            },
          },
          "/moved": { get: { operationId: "moved" } },
        },
      };
      const tools = await load(
        { "v.openapi.json": JSON.stringify(document) },
        { allowPrivateAddresses: [] },
      );
      expect(tools.get("v.getPet")?.origin).toMatchObject({
        server: `http://127.0.0.1:${apiPort}/v2`,
      });
      // The model names the other port: it is a query argument, the connection stays on the
      // configured host.
      const echo = await invoke(tools.get("v.getPet"), { petId: "1", port: otherPort });
      expect(echo).toMatchObject({ path: "/v2/pet/1", query: `?port=${otherPort}` });
      // The trusted host redirects to the other port: guarded like any other host.
      const err = await failure(tools.get("v.moved")!.handler({}, ctx()));
      expect(err).toMatchObject({
        code: "permission_denied",
        details: { reason: "private_address" },
      });
      expect(reached).toBe(0);
    } finally {
      await other.close();
    }
  });

  it("serves a large public API description (GitHub's REST API)", async () => {
    const started = performance.now();
    const document = await readOpenApiDocument(GITHUB, fetch);
    const read = performance.now();
    const result = openApiTools(document, {
      options: OpenApiSourceFileSchema.parse({ spec: GITHUB, prefix: "github" }),
      location: GITHUB,
      env: {},
      fetch,
    });
    const built = performance.now();
    const catalogBytes = result.tools.reduce(
      (n, t) =>
        n +
        Buffer.byteLength(
          JSON.stringify({ name: t.name, description: t.description, parameters: t.parameters }),
        ),
      0,
    );
    // Reported, not asserted: timing belongs to the benchmarks.
    process.stdout.write(
      `GitHub REST API: ${result.operations} operations → ${result.tools.length} tools; ` +
        `read and dereferenced in ${Math.round(read - started)} ms, tools built in ${Math.round(built - read)} ms; ` +
        `catalog ${catalogBytes} bytes; ${result.warnings.length} warnings\n`,
    );
    expect(result.tools.length).toBeGreaterThanOrEqual(200);
    expect(result.tools.length).toBe(result.operations);
    const issue = result.tools.find((t) => t.name === "github.issues/create");
    expect(issue?.parameters).toMatchObject({
      required: expect.arrayContaining(["owner", "repo", "title"]),
      properties: { owner: { type: "string" }, title: {} },
    });
    expect(result.warnings.map((w) => w.tool)).toContain("github.repos/upload-release-asset");
    // A 13 MB document: minutes on a loaded shared machine, seconds otherwise.
  }, 300_000);
});

describe("toolmesh tools import-openapi", () => {
  it("prints the tools and one warning per unsupported part, makes the folder, and refuses to overwrite", async () => {
    const parent = await mkdtemp(join(tmpdir(), "toolmesh-import-"));
    // The default folder (tools/native) need not exist: the first import makes it.
    const folder = join(parent, "tools", "native");
    const env = { TOOLMESH_NATIVE_TOOLS_DIR: folder };
    const spec = join(EXAMPLES, "3.0", "json", "file-uploads.json");
    try {
      const dry = await runCli(["tools", "import-openapi", spec, "--dry-run", "--json"], env);
      expect(dry.code, dry.stderr).toBe(0);
      const printed = JSON.parse(dry.stdout) as { tools: unknown[]; warnings: unknown[] };
      expect(printed.tools).toHaveLength(3);
      expect(printed.warnings).toContainEqual({
        tool: "file-uploads.post_anything_multipart_formdata",
        message:
          "the request body is multipart/form-data, which is not supported (JSON only); the operation is served without a body",
      });
      const first = await runCli(["tools", "import-openapi", spec, "--prefix", "files"], env);
      expect(first.code, first.stderr).toBe(0);
      expect(first.stderr).toContain(
        "toolmesh: warning: files.post_anything_image_png: the request body is image/png",
      );
      expect(first.stdout).toContain(`wrote ${join(folder, "files.openapi.yaml")}`);
      const again = await runCli(["tools", "import-openapi", spec, "--prefix", "files"], env);
      expect(again).toMatchObject({ code: 2 });
      expect(again.stderr.trim()).toBe(
        `toolmesh: ${join(folder, "files.openapi.yaml")} exists already; choose another --prefix or remove it`,
      );
      const unreadable = await runCli(["tools", "import-openapi", join(folder, "none.json")], env);
      expect(unreadable.code).toBe(2);
      expect(unreadable.stderr).toMatch(
        /^toolmesh: cannot read OpenAPI document .*none\.json: ENOENT/,
      );
    } finally {
      await rm(parent, { recursive: true, force: true });
    }
  });
});

import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import type { IncomingMessage, ServerResponse } from "node:http";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { ToolmeshClient } from "@toolmesh/client";
import type { ToolMessage } from "@toolmesh/protocol";
import { createSubjects } from "@toolmesh/protocol";
import { ToolRegistry } from "@toolmesh/registry";
import { createLogger } from "@toolmesh/telemetry";
import { stringify as toYaml } from "yaml";
import { callOnce, startHttpApi } from "./helpers/http-api.js";
import type { HttpApi } from "./helpers/http-api.js";
import { startNatsServer } from "./helpers/nats-server.js";
import type { NatsServerHandle } from "./helpers/nats-server.js";
import { killAllServices, startService, toolAvailable } from "./helpers/mesh.js";
import { runCli } from "./helpers/cli.js";

// OpenAPI tools end to end: the petstore document of @readme/oas-examples (MIT) served by this
// test's HTTP server, named by URL in a source file written by `toolmesh tools import-openapi`,
// an executor process serving it with the API key from its environment, a resolver process,
// and calls from the TypeScript client.

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const PETSTORE = join(
  ROOT,
  "node_modules",
  "@readme",
  "oas-examples",
  "3.0",
  "json",
  "petstore.json",
);
const KEY = "petstore-key-5e2a";

let nats: NatsServerHandle;
let api: HttpApi;
let apiUrl: string;
let toolsDir: string;
let nc: NatsConnection;
let client: ToolmeshClient;
const seen: { method: string; url: string; key: string | undefined; body: string }[] = [];

function answer(req: IncomingMessage, res: ServerResponse, body: string): void {
  const url = new URL(req.url ?? "/", "http://localhost");
  seen.push({
    method: req.method ?? "",
    url: req.url ?? "",
    key: req.headers.api_key as string | undefined,
    body,
  });
  const json = (status: number, value: unknown): void => {
    res.writeHead(status, { "content-type": "application/json" });
    res.end(JSON.stringify(value));
  };
  if (url.pathname === "/petstore.json") {
    void readFile(PETSTORE, "utf8").then((text) => {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(text);
    });
    return;
  }
  const pet = /^\/v2\/pet\/(\d+)$/.exec(url.pathname);
  if (req.method === "GET" && pet !== null) {
    if (pet[1] === "404") json(404, { code: 1, type: "error", message: "Pet not found" });
    else json(200, { id: Number(pet[1]), name: "Rex", status: "available" });
    return;
  }
  if (req.method === "POST" && url.pathname === "/v2/pet") {
    json(200, { id: 99, ...(JSON.parse(body) as object) });
    return;
  }
  json(405, { message: "not here" });
}

function call(name: string, args: Record<string, unknown> = {}): Promise<ToolMessage> {
  return callOnce(client, name, args);
}

beforeAll(async () => {
  api = await startHttpApi(answer);
  apiUrl = api.url;
  toolsDir = await mkdtemp(join(tmpdir(), "toolmesh-openapi-mesh-"));
  nats = await startNatsServer();
  const env = {
    NATS_URL: nats.url,
    TOOLMESH_NATIVE_TOOLS_DIR: toolsDir,
    TOOLMESH_NATIVE_ALLOWED_URLS: `${apiUrl}/`,
    TOOLMESH_ALLOW_PRIVATE_ADDRESSES: "127.0.0.1",
  };
  // The import writes the source file; the secret is added to it as an operator would.
  const imported = await runCli(
    [
      "tools",
      "import-openapi",
      `${apiUrl}/petstore.json`,
      "--prefix",
      "petstore",
      "--include-tags",
      "pet",
      "--base-url",
      `${apiUrl}/v2`,
    ],
    env,
  );
  expect(imported.code, imported.stderr).toBe(0);
  expect(imported.stdout).toContain("petstore.getPetById  GET /pet/{petId}  Find pet by ID");
  expect(imported.stdout).toMatch(/8 tools from 20 operations, \d+ warnings; wrote /);
  const file = join(toolsDir, "petstore.openapi.yaml");
  const source =
    (await readFile(file, "utf8")) + toYaml({ auth: { api_key: { env: "PETSTORE_KEY" } } });
  await writeFile(file, source);
  const resolver = await startService("resolver", env);
  await startService("executor", { ...env, PETSTORE_KEY: KEY });
  await toolAvailable(resolver, ...["petstore.getPetById", "petstore.addPet"]);
  nc = await connect({ servers: nats.url });
  client = new ToolmeshClient(nc, { defaultTimeoutMs: 20_000 });
});

afterAll(async () => {
  await nc?.close();
  await killAllServices();
  await nats?.stop();
  await api?.close();
  if (toolsDir !== undefined) await rm(toolsDir, { recursive: true, force: true });
});

describe("OpenAPI tools through the mesh", () => {
  it("registers the document's operations and runs them through resolver and executor", async () => {
    const registry = await ToolRegistry.open(nc, {
      subjects: createSubjects(),
      log: createLogger({ service: "test", level: "silent" }),
    });
    const registered = [...registry.names()].filter((t) => t.startsWith("petstore."));
    const owners = new Set(registered.map((t) => registry.get(t)?.definition.owner));
    registry.close();
    expect(owners).toEqual(new Set(["executor"]));
    expect(registered.sort()).toEqual([
      "petstore.addPet",
      "petstore.deletePet",
      "petstore.findPetsByStatus",
      "petstore.findPetsByTags",
      "petstore.getPetById",
      "petstore.updatePet",
      "petstore.updatePetWithForm",
      "petstore.uploadFile",
    ]);
    const got = await call("petstore.getPetById", { petId: 7 });
    expect(got.error).toBeUndefined();
    expect(JSON.parse(got.content)).toEqual({ id: 7, name: "Rex", status: "available" });
    expect(seen.find((s) => s.url === "/v2/pet/7")?.key).toBe(KEY);

    const created = await call("petstore.addPet", { name: "Bo", photoUrls: [] });
    expect(created.error).toBeUndefined();
    expect(JSON.parse(created.content)).toMatchObject({ id: 99, name: "Bo" });
  });

  it("answers bad arguments, a missing required one and a non-2xx status with typed errors", async () => {
    const wrongType = await call("petstore.getPetById", { petId: "seven" });
    expect(wrongType.error?.code).toBe("invalid_parameters");
    const missing = await call("petstore.addPet", { photoUrls: [] });
    expect(missing.error).toMatchObject({ code: "missing_arguments" });
    const notFound = await call("petstore.getPetById", { petId: 404 });
    expect(notFound.error).toMatchObject({
      code: "tool_error",
      details: { status: 404, body: '{"code":1,"type":"error","message":"Pet not found"}' },
    });
  });
});

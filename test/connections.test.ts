import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { nkeys } from "@nats-io/nats-core";
import { connectNats } from "@toolmesh/nats";
import { ToolmeshError } from "@toolmesh/protocol";
import { runCli } from "./helpers/cli.js";
import { startNatsServer, stopAll, type NatsServerHandle } from "./helpers/nats-server.js";
import { createTestPki, type TestPki } from "./helpers/tls.js";

// Every authentication method platform teams use, against real servers: TLS with client
// certificates and a private CA, user/password, an nkey seed and a token. Secrets must not
// show in what a refused connection reports.
const PASSWORD = "pw-9f3c1e-never-printed";
const TOKEN = "tok-71ab0c-never-printed";

let pki: TestPki;
let tlsServer: NatsServerHandle;
let tokenServer: NatsServerHandle;
let dir: string;
let seedFile: string;

beforeAll(async () => {
  pki = await createTestPki();
  dir = await mkdtemp(join(tmpdir(), "toolmesh-conn-"));
  const user = nkeys.createUser();
  seedFile = join(dir, "user.nk");
  await writeFile(seedFile, `${new TextDecoder().decode(user.getSeed())}\n`);
  tlsServer = await startNatsServer({
    config: [
      pki.serverTlsBlock(),
      "authorization {",
      "  users: [",
      `    { user: alice, password: "${PASSWORD}" }`,
      `    { nkey: ${user.getPublicKey()} }`,
      "  ]",
      "}",
    ].join("\n"),
  });
  tokenServer = await startNatsServer({ config: `authorization { token: "${TOKEN}" }` });
});

afterAll(async () => {
  await tlsServer?.stop();
  await tokenServer?.stop();
  await stopAll();
  await pki?.remove();
  await rm(dir, { recursive: true, force: true });
});

function tls(): { tlsCa: string; tlsCert: string; tlsKey: string } {
  return { tlsCa: pki.caFile, tlsCert: pki.clientCert, tlsKey: pki.clientKey };
}

async function refusal(connecting: Promise<unknown>): Promise<ToolmeshError> {
  const err = await connecting.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ToolmeshError);
  return err as ToolmeshError;
}

describe("TLS with client certificates and a private CA", () => {
  it("connects with the CA, a client certificate and user/password", async () => {
    const nc = await connectNats({
      servers: tlsServer.url,
      ...tls(),
      user: "alice",
      password: PASSWORD,
    });
    expect(nc.info?.tls_required ?? nc.info?.tls_verify).toBe(true);
    await nc.close();
  });

  it("connects with an nkey seed file", async () => {
    const nc = await connectNats({ servers: tlsServer.url, ...tls(), nkey: seedFile });
    await nc.close();
  });

  it("refuses a client without a certificate, or with one from another CA", async () => {
    const noCert = await refusal(
      connectNats({
        servers: tlsServer.url,
        tlsCa: pki.caFile,
        user: "alice",
        password: PASSWORD,
        connectTimeoutMs: 1_000, // the server drops the handshake; nothing tells the client
      }),
    );
    expect(noCert.code).toBe("unavailable");
    expect(noCert.message).toMatch(/^cannot connect to NATS at (nats|tls):\/\/127\.0\.0\.1:\d+: /);
    const stranger = await refusal(
      connectNats({
        servers: tlsServer.url,
        tlsCa: pki.caFile,
        tlsCert: pki.strangerCert,
        tlsKey: pki.strangerKey,
        user: "alice",
        password: PASSWORD,
        connectTimeoutMs: 1_000,
      }),
    );
    expect(stranger.code).toBe("unavailable");
  });

  it("refuses a wrong password without showing any secret", async () => {
    const wrong = await refusal(
      connectNats({
        servers: tlsServer.url.replace("://", `://alice:${PASSWORD}x@`),
        ...tls(),
      }),
    );
    expect(wrong.message).toMatch(/authorization/i);
    expect(wrong.message).not.toContain(PASSWORD);
    expect(wrong.message).toContain("***@127.0.0.1");
  });

  it("names the option of a file that cannot be read, and wants certificate and key together", async () => {
    const missing = await refusal(
      connectNats({ servers: tlsServer.url, tlsCa: join(dir, "nope.pem") }),
    );
    expect(missing.message).toContain("NATS_CA file (--tlsca)");
    const half = await refusal(connectNats({ servers: tlsServer.url, tlsCert: pki.clientCert }));
    expect(half.message).toContain("NATS_CERT and NATS_KEY");
  });

  it("the CLI takes natscli's flags and variables", async () => {
    const byFlags = await runCli(
      [
        "tools",
        "list",
        "--server",
        tlsServer.url,
        "--user",
        "alice",
        "--password",
        PASSWORD,
      ].concat(["--tlsca", pki.caFile, "--tlscert", pki.clientCert, "--tlskey", pki.clientKey]),
      {},
    );
    expect(byFlags.stderr).toBe("");
    expect(byFlags.code).toBe(0);
    const env = {
      NATS_URL: tlsServer.url,
      NATS_CA: pki.caFile,
      NATS_CERT: pki.clientCert,
      NATS_KEY: pki.clientKey,
    };
    const byEnv = await runCli(["tools", "list"], { ...env, NATS_NKEY: seedFile });
    expect(byEnv.code).toBe(0);
    const refused = await runCli(["tools", "list"], {
      ...env,
      NATS_USER: "alice",
      NATS_PASSWORD: `${PASSWORD}-wrong`,
    });
    expect(refused.code).toBe(2);
    expect(refused.stderr).toMatch(/^toolmesh: cannot connect to NATS at .*\n$/);
    expect(refused.stderr).not.toContain(PASSWORD);
    const half = await runCli(["tools", "list"], { NATS_URL: tlsServer.url, NATS_CERT: "x" });
    expect(half.code).toBe(2);
    expect(half.stderr).toContain("NATS_CERT and NATS_KEY");
  });
});

describe("token", () => {
  it("connects with the token and refuses another without showing either", async () => {
    const nc = await connectNats({ servers: tokenServer.url, token: TOKEN });
    await nc.close();
    const wrong = await refusal(connectNats({ servers: tokenServer.url, token: `${TOKEN}-x` }));
    expect(wrong.message).not.toContain(TOKEN);
    const cli = await runCli(["tools", "list"], {
      NATS_URL: tokenServer.url,
      NATS_TOKEN: `${TOKEN}-x`,
    });
    expect(cli.code).toBe(2);
    expect(cli.stderr).not.toContain(TOKEN);
  });
});

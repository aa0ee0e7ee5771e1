import { mkdtemp, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { AuthError, Authenticator, keyDigest, loadKeysFile } from "./auth.js";
import { GatewayConfigError, loadGatewayConfig } from "./config.js";
import { CredentialLimits } from "./limits.js";

async function keysFile(text: string): Promise<string> {
  const file = join(await mkdtemp(join(tmpdir(), "gateway-keys-")), "keys.yaml");
  await writeFile(file, text);
  return file;
}

describe("loadGatewayConfig", () => {
  it("refuses to start with no authentication, naming the variables", () => {
    expect(() => loadGatewayConfig({})).toThrow(GatewayConfigError);
    expect(() => loadGatewayConfig({})).toThrow(/TOOLMESH_GATEWAY_KEYS_FILE/);
  });

  it("names the variable of a bad value", () => {
    expect(() =>
      loadGatewayConfig({ TOOLMESH_GATEWAY_KEYS_FILE: "k", TOOLMESH_GATEWAY_PORT: "http" }),
    ).toThrow(/^TOOLMESH_GATEWAY_PORT: /);
    expect(() => loadGatewayConfig({ TOOLMESH_GATEWAY_JWKS_URL: "ftp://x/jwks" })).toThrow(
      /^TOOLMESH_GATEWAY_JWKS_URL: must be an http\(s\) URL/,
    );
    expect(() => loadGatewayConfig({ TOOLMESH_GATEWAY_JWKS_URL: "https://a/jwks" })).toThrow(
      /TOOLMESH_GATEWAY_JWT_AUDIENCE/,
    );
  });

  it("takes a consent page's URL with {audience} and {scope} in it, and names a bad one", () => {
    const template = "https://login.example.com/consent?audience={audience}&scope={scope}";
    const config = loadGatewayConfig({
      TOOLMESH_GATEWAY_ANONYMOUS_TENANT: "dev",
      TOOLMESH_GATEWAY_CONSENT_URL: template,
    });
    expect(config.consentUrl).toBe(template);
    for (const bad of ["login.example.com/consent", "javascript:alert({audience})"])
      expect(() =>
        loadGatewayConfig({
          TOOLMESH_GATEWAY_ANONYMOUS_TENANT: "dev",
          TOOLMESH_GATEWAY_CONSENT_URL: bad,
        }),
      ).toThrow(/^TOOLMESH_GATEWAY_CONSENT_URL: must be an http\(s\) URL/);
  });

  it("takes the flag's port over the variable", () => {
    const config = loadGatewayConfig(
      { TOOLMESH_GATEWAY_ANONYMOUS_TENANT: "dev", TOOLMESH_GATEWAY_PORT: "1" },
      { TOOLMESH_GATEWAY_PORT: "2" },
    );
    expect(config.port).toBe(2);
    expect(config.allowedOrigins).toEqual([]);
  });
});

describe("keys file", () => {
  it("reads sha256 and env entries", async () => {
    const file = await keysFile(
      `keys:\n  - sha256: ${keyDigest("a")}\n    tenant: t1\n    agents: [x]\n  - env: K\n    tenant: t2\n`,
    );
    const keys = await loadKeysFile(file, { K: "b" });
    expect(keys.get(keyDigest("a"))).toMatchObject({ tenant: "t1", agents: ["x"] });
    expect(keys.get(keyDigest("b"))).toMatchObject({ tenant: "t2" });
  });

  it("accepts JSON", async () => {
    const file = await keysFile(
      JSON.stringify({ keys: [{ sha256: keyDigest("j"), tenant: "t" }] }),
    );
    expect((await loadKeysFile(file, {})).size).toBe(1);
  });

  it.each([
    ["keys:\n  - tenant: t\n", /exactly one of sha256 and env/],
    [`keys:\n  - sha256: abc\n    tenant: t\n`, /\/keys\/0\/sha256 must be 64 hex digits/],
    ["keys:\n  - env: MISSING\n    tenant: t\n", /variable MISSING is not set/],
    [`keys:\n  - sha256: ${keyDigest("a")}\n    tenant: t\n    role: admin\n`, /role/],
    ["keys: [\n", /not YAML or JSON/],
  ])("refuses %j with a message naming the problem", async (text, message) => {
    const file = await keysFile(text);
    await expect(loadKeysFile(file, {})).rejects.toThrow(message);
  });

  it("lets in only a listed key", async () => {
    const file = await keysFile(`keys:\n  - sha256: ${keyDigest("right")}\n    tenant: t\n`);
    const auth = await Authenticator.create(
      loadGatewayConfig({ TOOLMESH_GATEWAY_KEYS_FILE: file }),
    );
    await expect(auth.authenticate("Bearer right")).resolves.toMatchObject({ tenant: "t" });
    await expect(auth.authenticate("Bearer wrong")).rejects.toBeInstanceOf(AuthError);
    await expect(auth.authenticate(undefined)).rejects.toMatchObject({ status: 401 });
    await expect(auth.authenticate("Basic cmlnaHQ=")).rejects.toMatchObject({ status: 401 });
  });
});

describe("CredentialLimits", () => {
  it("refuses over the rate, then admits again as time passes", () => {
    const limits = new CredentialLimits({ maxConcurrent: 100, ratePerS: 10, burst: 2 });
    const leave = [limits.enter("c", 0), limits.enter("c", 0)];
    expect(leave.every((l) => typeof l === "function")).toBe(true);
    expect(limits.enter("c", 0)).toMatchObject({ reason: "rate" });
    expect(typeof limits.enter("c", 100)).toBe("function");
    expect(typeof limits.enter("other", 0)).toBe("function");
  });

  it("refuses over the concurrency until a request ends", () => {
    const limits = new CredentialLimits({ maxConcurrent: 1, ratePerS: 0, burst: 1 });
    const first = limits.enter("c");
    expect(limits.enter("c")).toMatchObject({ reason: "concurrency" });
    if (typeof first === "function") first();
    expect(typeof limits.enter("c")).toBe("function");
  });
});

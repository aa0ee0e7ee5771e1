import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { join } from "node:path";
import { createInterface } from "node:readline";

/** The authorization server of `auth-server.mjs`, in a process of its own. */
export interface AuthServer {
  url: string;
  idpIssuer: string;
  process: ChildProcess;
  /** Calls one of its admin endpoints (`login`, `consent`, `revoke`, `clock`, `issued`). */
  admin<T = Record<string, unknown>>(path: string, body?: unknown): Promise<T>;
}

/** Starts the authorization server, its IdP and its API, for `clientId`/`clientSecret`. */
export async function startAuthServer(options: {
  gatewayAudience: string;
  apiAudience: string;
  clientId: string;
  clientSecret: string;
}): Promise<AuthServer> {
  const child = spawn(process.execPath, [join(import.meta.dirname, "auth-server.mjs")], {
    env: {
      ...process.env,
      GATEWAY_AUDIENCE: options.gatewayAudience,
      API_AUDIENCE: options.apiAudience,
      CLIENT_ID: options.clientId,
      CLIENT_SECRET: options.clientSecret,
    },
    stdio: ["ignore", "pipe", "inherit"],
  });
  const first = await new Promise<string>((resolve, reject) => {
    if (child.stdout === null) throw new Error("no stdout");
    createInterface({ input: child.stdout }).once("line", resolve);
    child.once("exit", (code) => {
      reject(new Error(`authorization server exited ${String(code)}`));
    });
  });
  const { url, idpIssuer } = JSON.parse(first) as { url: string; idpIssuer: string };
  return {
    url,
    idpIssuer,
    process: child,
    async admin<T>(path: string, body?: unknown): Promise<T> {
      const res = await fetch(`${url}/admin/${path}`, {
        method: body === undefined ? "GET" : "POST",
        ...(body === undefined ? {} : { body: JSON.stringify(body) }),
      });
      return (await res.json()) as T;
    },
  };
}

/** RFC 8693: exchanges a user's token at `url` for a refresh token for `audience`. */
export async function exchange(
  url: string,
  client: { id: string; secret: string },
  subjectToken: string,
  audience: string,
): Promise<Record<string, unknown>> {
  const res = await fetch(`${url}/token`, {
    method: "POST",
    headers: {
      authorization: `Basic ${Buffer.from(`${client.id}:${client.secret}`).toString("base64")}`,
    },
    body: new URLSearchParams({
      grant_type: "urn:ietf:params:oauth:grant-type:token-exchange",
      subject_token: subjectToken,
      subject_token_type: "urn:ietf:params:oauth:token-type:access_token",
      requested_token_type: "urn:ietf:params:oauth:token-type:refresh_token",
      audience,
    }),
  });
  return (await res.json()) as Record<string, unknown>;
}

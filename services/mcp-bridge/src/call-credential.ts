import { AsyncLocalStorage } from "node:async_hooks";
import type { FetchLike } from "@toolmesh/tool-host";
import type { McpServerConfig } from "./config.js";

// A server whose tools act as their caller (`credentials` of type `user-secret` or
// `token-exchange`) gets the caller's credential on each `tools/call` request, not on the
// session: one connection serves every caller, and its other requests (initialize, tools/list,
// its event stream) keep the headers of the server's file.

/** The `Authorization` of the call whose requests run in this async context. */
const current = new AsyncLocalStorage<string>();

/** The `Authorization` a call of the server's tools is sent with, or undefined. */
export function callAuthorization(
  config: McpServerConfig,
  credential: string | undefined,
): string | undefined {
  const declared = config.credentials;
  if (declared === undefined || declared.type === "service" || credential === undefined)
    return undefined;
  return `${declared.scheme} ${credential}`;
}

/** Runs `send` so that the HTTP requests it makes carry `authorization` (when given). */
export function sendingAs<T>(
  authorization: string | undefined,
  send: () => Promise<T>,
): Promise<T> {
  return authorization === undefined ? send() : current.run(authorization, send);
}

/** `fetch` that sets the `Authorization` of the call it is made for, if any. */
export function withCallAuthorization(fetch: FetchLike): FetchLike {
  return (input, init) => {
    const authorization = current.getStore();
    if (authorization === undefined) return fetch(input, init);
    const headers = new Headers(init?.headers);
    headers.set("authorization", authorization);
    return fetch(input, { ...init, headers });
  };
}

import { z } from "zod";
import type { ToolModule } from "./tool-module.js";

const AuthScheme = z
  .string()
  .regex(/^[A-Za-z][A-Za-z0-9!#$%&'*+.^_`|~-]*$/, "must be an HTTP authentication scheme")
  .default("Bearer");

/**
 * What a tool reached over HTTP acts with downstream (ADR 0061): `service` is its own `auth`,
 * the same for every caller; `user-secret` sends the calling user's stored secret as the
 * request's `Authorization`, after `scheme` (default `Bearer`); `token-exchange` sends an
 * access token for `audience` issued for the calling user when the call runs. HTTP tool files,
 * OpenAPI sources and bridged MCP servers over HTTP declare it alike.
 */
export const HttpCredentialsSchema = z.discriminatedUnion("type", [
  z.strictObject({ type: z.literal("service") }),
  z.strictObject({ type: z.literal("user-secret"), scheme: AuthScheme }),
  z.strictObject({
    type: z.literal("token-exchange"),
    audience: z.string().min(1),
    scopes: z.array(z.string().min(1)).default([]),
    scheme: AuthScheme,
  }),
]);

/** What a tool reached over HTTP acts with downstream; see {@link HttpCredentialsSchema}. */
export type HttpCredentials = z.infer<typeof HttpCredentialsSchema>;

/** The credentials as the tool's definition declares them. */
export function declaredCredentials(c: HttpCredentials): NonNullable<ToolModule["credentials"]> {
  return c.type === "token-exchange"
    ? { type: c.type, audience: c.audience, scopes: c.scopes }
    : { type: c.type };
}

/** The scheme the caller's own credential is sent as `Authorization` with, when it is. */
export function callerScheme(c: HttpCredentials | undefined): string | undefined {
  return c === undefined || c.type === "service" ? undefined : c.scheme;
}

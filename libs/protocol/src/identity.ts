import { z } from "zod";

const Name = z.string().min(1).max(1024);

/** One party in an actor chain: a service acting for the caller (RFC 8693 `act`). */
export const ActorSchema = z
  .object({
    issuer: Name.optional().describe("Who vouches for the actor; absent: the caller's issuer."),
    subject: Name.describe("The actor's subject (`sub` of its `act` claim)."),
  })
  .strict()
  .meta({ id: "Actor", description: "A service acting for the caller." });

/** One party in an actor chain. */
export type Actor = z.infer<typeof ActorSchema>;

/**
 * Who a call acts for, as verified where it entered the mesh: the gateway fills it from the
 * caller's JWT or API key entry; a NATS frontend may set it for users of its own tenant only.
 * Never a token: the object is closed, so a credential cannot ride along in it.
 */
export const CallerIdentitySchema = z
  .object({
    issuer: Name.describe(
      "Who vouched for the subject: the JWT's `iss`, or `urn:toolmesh:gateway-key` for a gateway API key.",
    ),
    subject: Name.describe("The user (or service) the call acts for: the JWT's `sub`."),
    tenant: z
      .string()
      .min(1)
      .max(256)
      .describe("The tenant the subject belongs to; equals the tenant the call was submitted in."),
    actor: z
      .array(ActorSchema)
      .max(8)
      .optional()
      .describe("Services acting for the subject, nearest first (the JWT's nested `act`)."),
  })
  .strict()
  .meta({ id: "CallerIdentity", description: "The verified identity a call acts for." });

/** Who a call acts for. */
export type CallerIdentity = z.infer<typeof CallerIdentitySchema>;

/** The `issuer` of identities the gateway derives from an API key entry that names a subject. */
export const GATEWAY_KEY_ISSUER = "urn:toolmesh:gateway-key";

import { MESH_ACCOUNT, ownerAccount, renderAccountConfig } from "@toolmesh/nats";
import type { ExtraUser, Permissions } from "@toolmesh/nats";
import type { NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import type { Subjects } from "@toolmesh/protocol";
import { startNatsServer } from "./nats-server.js";
import type { NatsServerHandle } from "./nats-server.js";

/** Every subject, both ways: a user confined by its account alone. */
const EVERYTHING: Permissions = { publish: { allow: [">"] }, subscribe: { allow: [">"] } };

/**
 * The nats-server `accounts` block `toolmesh auth config --owner OWNER=TOOLS …` generates (ADR
 * 0031), what operators deploy: the mesh in `TOOLMESH` with JetStream, each owner in
 * `OWNER_{o}` (JetStream for its users' secrets only), crossing to its owner services, the abort broadcast and each of its
 * tools' work consumers. Every user's password is its name, defined in the file. The generated
 * users (`executor-{o}`, `mcp-bridge-{o}`, `resolver`, …) keep their generated permissions; the
 * test adds `mesh` (every right in the mesh account) and, in each owner's account, `{o}` with
 * every right there: an owner that ignores its users' permissions still has only its account's
 * crossings, which is what the attack suites attack.
 */
export function ownerAccountsConfig(
  subjects: Subjects,
  owners: Readonly<Record<string, readonly string[]>>,
  tenants: readonly string[] = [],
): string {
  const extraUsers: ExtraUser[] = [
    { account: MESH_ACCOUNT, user: "mesh", permissions: EVERYTHING },
    ...Object.keys(owners).map((owner) => ({
      account: ownerAccount(owner),
      user: owner,
      permissions: EVERYTHING,
    })),
  ];
  const accounts = renderAccountConfig({
    prefix: subjects.prefix,
    tenants,
    owners,
    extraUsers,
  });
  const variables = [...accounts.matchAll(/user: "([^"]+)"\n\s+password: \$(\w+)/g)].map(
    ([, user, variable]) => `${variable}: ${JSON.stringify(user)}`,
  );
  return [...variables, accounts].join("\n");
}

/** A server with two owner accounts and the connections the owner attack suites use. */
export interface RogueAndVictim {
  server: NatsServerHandle;
  /** Every right in the mesh account. */
  mesh: NatsConnection;
  /** Owner `acme` with every right in its own account: the attacker. */
  rogue: NatsConnection;
  /** Owner `globex`'s generated executor user, which serves `echo`: the victim. */
  globexNc: NatsConnection;
}

/**
 * Starts a server with the generated accounts of owners `acme` (no granted names) and `globex`
 * (granted `echo`), and connects as the mesh, the rogue owner and the victim's executor.
 */
export async function startRogueAndVictim(subjects: Subjects): Promise<RogueAndVictim> {
  const server = await startNatsServer({
    config: ownerAccountsConfig(subjects, { acme: [], globex: ["echo"] }),
  });
  const mesh = await connect({ servers: server.url, user: "mesh", pass: "mesh" });
  const rogue = await connect({ servers: server.url, user: "acme", pass: "acme" });
  const globexNc = await connect({
    servers: server.url,
    user: "executor-globex",
    pass: "executor-globex",
    inboxPrefix: subjects.ownerInboxPrefix("executor", "globex"),
  });
  return { server, mesh, rogue, globexNc };
}

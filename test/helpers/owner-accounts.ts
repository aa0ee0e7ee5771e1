import { MESH_ACCOUNT, ownerAccount, renderAccountConfig } from "@toolmesh/nats";
import type { ExtraUser, Permissions } from "@toolmesh/nats";
import type { Subjects } from "@toolmesh/protocol";

/** Every subject, both ways: a user confined by its account alone. */
const EVERYTHING: Permissions = { publish: { allow: [">"] }, subscribe: { allow: [">"] } };

/**
 * The nats-server `accounts` block `toolmesh auth config --owner OWNER=TOOLS …` generates (ADR
 * 0031), what operators deploy: the mesh in `TOOLMESH` with JetStream, each owner in
 * `OWNER_{o}` without it, crossing to its owner services, the abort broadcast and each of its
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

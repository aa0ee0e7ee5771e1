import type { Command } from "commander";
import { Option } from "commander";
import type { RuntimeConfig } from "@toolmesh/runtime";
import type { PermissionRole } from "./permissions.js";
import {
  PERMISSION_ROLES,
  renderAccountConfig,
  renderPermissions,
  rolePermissions,
} from "./permissions.js";
import { say } from "./print.js";

function list(value: string, previous: string[] = []): string[] {
  return [
    ...previous,
    ...value
      .split(",")
      .map((v) => v.trim())
      .filter((v) => v !== ""),
  ];
}

/**
 * `toolmesh auth permissions` (the permissions block of one role; a frontend's tenant is the
 * global `--tenant`, `TOOLMESH_TENANT`) and `toolmesh auth config`
 * (the account with a user per role, what `deploy/nats/toolmesh.conf` holds). Both follow the
 * prefix of the configuration (`TOOLMESH_PREFIX`, `--prefix`).
 */
export function addAuthCommands(
  program: Command,
  config: () => RuntimeConfig,
  run: (command: () => Promise<number>) => void,
): void {
  const auth = program
    .command("auth")
    .description("NATS users and permissions for each role (docs/security.md)");
  auth
    .command("permissions")
    .description("print the least publish/subscribe permissions of one role")
    .addOption(
      new Option("--role <role>", "the role").choices(PERMISSION_ROLES).makeOptionMandatory(),
    )
    .option("--session <id>", "frontend: confine it to this one session too")
    .option("--tools <names>", "executor: tool names it may register (ns.* for a namespace)", list)
    .option("--servers <names>", "mcp-bridge: MCP server names it serves", list)
    .option("--json", "print JSON")
    .action(
      (o: {
        role: PermissionRole;
        session?: string;
        tools?: string[];
        servers?: string[];
        json?: boolean;
      }) =>
        run(() => {
          const c = config();
          const permissions = rolePermissions(o.role, {
            prefix: c.prefix,
            // The global --tenant (TOOLMESH_TENANT) names the frontend's tenant.
            ...(o.role === "frontend" ? { tenant: c.tenant } : {}),
            ...(o.session === undefined ? {} : { session: o.session }),
            ...(o.tools === undefined ? {} : { tools: o.tools }),
            ...(o.servers === undefined ? {} : { servers: o.servers }),
          });
          say(o.json === true ? JSON.stringify(permissions) : renderPermissions(permissions));
          return Promise.resolve(0);
        }),
    );
  auth
    .command("config")
    .description("print a nats-server accounts block with one user per role and per tenant")
    .option("--tenants <ids>", "tenants that get a frontend user (default: default)", list)
    .action((o: { tenants?: string[] }) =>
      run(() => {
        const prefix = config().prefix;
        process.stdout.write(
          renderAccountConfig({
            ...(prefix === "toolmesh" ? {} : { prefix }),
            ...(o.tenants === undefined ? {} : { tenants: o.tenants }),
          }),
        );
        return Promise.resolve(0);
      }),
    );
}

import type { Command } from "commander";
import { InvalidArgumentError, Option } from "commander";
import type { RuntimeConfig } from "@toolmesh/runtime";
import type { PermissionRole } from "@toolmesh/nats";
import {
  PERMISSION_ROLES,
  renderAccountConfig,
  renderPermissions,
  rolePermissions,
} from "@toolmesh/nats";
import { say } from "./print.js";
import { ErrorCode, ToolmeshError } from "@toolmesh/protocol";
import { commaList } from "./comma-list.js";
import { positiveInt } from "./option-values.js";

/**
 * `--owner OWNER[=NAME,…]`, repeatable: each owner with the names granted to it beyond its own
 * namespace `OWNER.*` (ADR 0041).
 */
function ownerGrants(
  value: string,
  previous: Record<string, string[]> = {},
): Record<string, string[]> {
  const eq = value.indexOf("=");
  const owner = (eq < 0 ? value : value.slice(0, eq)).trim();
  const names = eq < 0 ? [] : commaList(value.slice(eq + 1));
  if (owner === "" || (eq >= 0 && names.length === 0)) {
    throw new InvalidArgumentError(
      "expected OWNER or OWNER=NAME[,NAME…], e.g. billing, or billing=github.*,refund",
    );
  }
  return { ...previous, [owner]: [...(previous[owner] ?? []), ...names] };
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
  addPermissionsCommand(auth, program, config, run);
  addConfigCommand(auth, config, run);
}

/** `toolmesh auth permissions`: one role's least rights; a frontend's tenant is the global `--tenant`. */
function addPermissionsCommand(
  auth: Command,
  program: Command,
  config: () => RuntimeConfig,
  run: (command: () => Promise<number>) => void,
): void {
  auth
    .command("permissions")
    .description("print the least publish/subscribe permissions of one role")
    .addOption(
      new Option("--role <role>", "the role").choices(PERMISSION_ROLES).makeOptionMandatory(),
    )
    .option("--session <id>", "frontend: confine it to this one session too")
    .option("--owner <id>", "executor, mcp-bridge: the tool owner whose account it lives in")
    .option(
      "--tools <names>",
      "executor: tool names it may register (ns.* for a namespace); not with --owner, whose names its account's imports grant",
      commaList,
    )
    .option("--servers <names>", "mcp-bridge: MCP server names it serves", commaList)
    .option(
      "--owners <ids>",
      "resolver, operator, setup: the tool owners with accounts, whose work streams it manages",
      commaList,
    )
    .option(
      "--tenants <ids>",
      "resolver, operator, setup: the tenants with accounts, whose calls streams it reads or manages, and whose audit trails it writes, reads or makes",
      commaList,
    )
    .option("--json", "print JSON")
    .action(
      (o: {
        role: PermissionRole;
        session?: string;
        owner?: string;
        tools?: string[];
        servers?: string[];
        owners?: string[];
        tenants?: string[];
        json?: boolean;
      }) =>
        run(() => {
          // An empty --tenant would otherwise read as unset and print the default tenant's.
          const tenant = program.opts<{ tenant?: string }>().tenant;
          if (
            (o.role === "frontend" || o.role === "approver") &&
            tenant !== undefined &&
            tenant.trim() === ""
          ) {
            throw new ToolmeshError(
              ErrorCode.InvalidRequest,
              "--tenant must not be empty: name the tenant whose frontend this is",
              { retryable: false },
            );
          }
          const c = config();
          const permissions = rolePermissions(o.role, {
            prefix: c.prefix,
            // The global --tenant (TOOLMESH_TENANT) names the frontend's tenant.
            ...(o.role === "frontend" || o.role === "approver" ? { tenant: c.tenant } : {}),
            ...(o.session === undefined ? {} : { session: o.session }),
            ...(o.owner === undefined ? {} : { owner: o.owner }),
            ...(o.tools === undefined ? {} : { tools: o.tools }),
            ...(o.servers === undefined ? {} : { servers: o.servers }),
            ...(o.owners === undefined ? {} : { owners: o.owners }),
            ...(o.tenants === undefined ? {} : { tenants: o.tenants }),
          });
          say(o.json === true ? JSON.stringify(permissions) : renderPermissions(permissions));
          return Promise.resolve(0);
        }),
    );
}

/** `toolmesh auth config`: the accounts file, an account per tenant and per tool owner. */
function addConfigCommand(
  auth: Command,
  config: () => RuntimeConfig,
  run: (command: () => Promise<number>) => void,
): void {
  auth
    .command("config")
    .description(
      "print the nats-server accounts: the mesh's, one per tenant and one per tool owner (ADR 0031)",
    )
    .option("--tenants <ids>", "tenants, an account each (default: default)", commaList)
    .option(
      "--owner <owner[=names]>",
      "a tool owner's account with its own work stream; it registers tools named OWNER.* and the names granted after = (a tool name, or ns.* such as an MCP server's tools); repeatable (default: none, executors and bridges in the mesh account)",
      ownerGrants,
    )
    .addOption(
      new Option("--max-connections <n>", "per tenant/owner account (default 1000)").argParser(
        positiveInt,
      ),
    )
    .addOption(
      new Option("--max-subscriptions <n>", "per tenant/owner account (default 100000)").argParser(
        positiveInt,
      ),
    )
    .addOption(
      new Option("--max-payload <bytes>", "per tenant/owner account (default 1048576)").argParser(
        positiveInt,
      ),
    )
    .action(
      (o: {
        tenants?: string[];
        owner?: Record<string, string[]>;
        maxConnections?: number;
        maxSubscriptions?: number;
        maxPayload?: number;
      }) =>
        run(() => {
          const prefix = config().prefix;
          process.stdout.write(
            renderAccountConfig({
              ...(prefix === "toolmesh" ? {} : { prefix }),
              ...(o.tenants === undefined ? {} : { tenants: o.tenants }),
              ...(o.owner === undefined ? {} : { owners: o.owner }),
              limits: {
                ...(o.maxConnections === undefined ? {} : { maxConnections: o.maxConnections }),
                ...(o.maxSubscriptions === undefined
                  ? {}
                  : { maxSubscriptions: o.maxSubscriptions }),
                ...(o.maxPayload === undefined ? {} : { maxPayload: o.maxPayload }),
              },
            }),
          );
          return Promise.resolve(0);
        }),
    );
}

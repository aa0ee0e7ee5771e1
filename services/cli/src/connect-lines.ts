import { Defaults } from "@toolmesh/protocol";
import { redactUrl } from "@toolmesh/nats";
import type { RuntimeConfig } from "@toolmesh/runtime";

/**
 * What `toolmesh dev` prints for frontends beside the gateway line: the NATS URL, and the
 * Python and TypeScript lines that connect a frontend of the dev tenant to it, each to be
 * pasted as it is (docs/first-call-python.md). Credentials in the URL are shown as `***`;
 * credentials set by variables are named, not printed.
 */
export function connectLines(config: Pick<RuntimeConfig, "nats" | "tenant" | "prefix">): string[] {
  const url = redactUrl(config.nats.servers);
  const tenant = JSON.stringify(config.tenant);
  const prefixed = config.prefix !== Defaults.prefix;
  const prefix = JSON.stringify(config.prefix);
  const python =
    `mesh = await toolmesh.connect(${JSON.stringify(url)}, tenant=${tenant}` +
    `${prefixed ? `, prefix=${prefix}` : ""})`;
  const subjects = prefixed ? `createSubjects({ prefix: ${prefix} })` : "createSubjects()";
  const typescript =
    `const client = new ToolmeshClient(await connectNats({ servers: ${JSON.stringify(url)}, ` +
    `inboxPrefix: ${subjects}.frontendInboxPrefix(${tenant}) }), ` +
    `{ tenant: ${tenant}${prefixed ? `, prefix: ${prefix}` : ""} });`;
  const credentials = credentialVariables(config.nats);
  return [
    `NATS: ${url} (frontends of tenant ${config.tenant} connect with)`,
    "  Python:      import toolmesh",
    `               ${python}`,
    '  TypeScript:  import { ToolmeshClient } from "@toolmesh/client"; import { connectNats } from "@toolmesh/nats"; import { createSubjects } from "@toolmesh/protocol";',
    `               ${typescript}`,
    ...(credentials.length === 0
      ? []
      : [
          `  with the credentials of ${credentials.join(", ")}: toolmesh.connect() reads them; ` +
            "give connectNats the same (user, password, token, creds, nkey)",
        ]),
  ];
}

function credentialVariables(nats: RuntimeConfig["nats"]): string[] {
  const named: [unknown, string][] = [
    [nats.user, "NATS_USER"],
    [nats.password, "NATS_PASSWORD"],
    [nats.token, "NATS_TOKEN"],
    [nats.creds, "NATS_CREDS"],
    [nats.nkey, "NATS_NKEY"],
    [nats.tlsCert, "NATS_CERT"],
    [nats.tlsCa, "NATS_CA"],
  ];
  return named.filter(([value]) => value !== undefined).map(([, variable]) => variable);
}

import type { Subjects } from "@toolmesh/protocol";

/**
 * A nats-server `accounts` block laid out as ADR 0031 lays out tool owners: the mesh in
 * `TOOLMESH` (JetStream, user `mesh`), each owner in `OWNER_{o}` without JetStream (user `o`,
 * password `o`), importing its owner services, the abort broadcast, and the consumer info,
 * pulls and acks of its tools' work consumers (the JetStream API ones below
 * `{prefix}.js.API`). Work consumers are named one by one: the work stream is shared.
 */
export function ownerAccountsConfig(
  subjects: Subjects,
  owners: Readonly<Record<string, readonly string[]>>,
): string {
  const work = subjects.streams.work;
  const exports: string[] = [];
  const accounts: string[] = [];
  for (const [owner, tools] of Object.entries(owners)) {
    const account = `OWNER_${owner}`;
    const consumers = tools.map((t) => subjects.workConsumer(t));
    const services = [
      `${subjects.prefix}.v1.owner.${owner}.>`,
      ...consumers.map((c) => `$JS.ACK.${work}.${c}.>`),
    ];
    const api = consumers.flatMap((c) => [
      { subject: `$JS.API.CONSUMER.MSG.NEXT.${work}.${c}`, stream: true },
      { subject: `$JS.API.CONSUMER.INFO.${work}.${c}`, stream: false },
    ]);
    exports.push(
      ...services.map((s) => `{ service: "${s}", accounts: [${account}] }`),
      ...api.map(
        (a) =>
          `{ service: "${a.subject}", accounts: [${account}]${a.stream ? ", response_type: stream" : ""} }`,
      ),
      `{ stream: "${subjects.abort}", accounts: [${account}] }`,
    );
    const imports = [
      ...services.map((s) => `{ service: { account: TOOLMESH, subject: "${s}" } }`),
      ...api.map(
        (a) =>
          `{ service: { account: TOOLMESH, subject: "${a.subject}" }, to: "${a.subject.replace("$JS.API", subjects.ownerJsApiPrefix)}" }`,
      ),
      `{ stream: { account: TOOLMESH, subject: "${subjects.abort}" } }`,
    ];
    accounts.push(`  ${account}: {
    users: [{ user: ${owner}, password: ${owner} }]
    imports: [
      ${imports.join("\n      ")}
    ]
  }`);
  }
  return `accounts: {
  TOOLMESH: {
    jetstream: enabled
    users: [{ user: mesh, password: mesh }]
    exports: [
      ${exports.join("\n      ")}
    ]
  }
${accounts.join("\n")}
}
`;
}

import { execFile } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";

const run = promisify(execFile);

/** PEM files of a throw-away CA, a server certificate for 127.0.0.1/localhost and a client certificate. */
export interface TestPki {
  readonly dir: string;
  readonly caFile: string;
  readonly serverCert: string;
  readonly serverKey: string;
  readonly clientCert: string;
  readonly clientKey: string;
  /** A client certificate from another CA, which the server must refuse. */
  readonly strangerCert: string;
  readonly strangerKey: string;
  /** nats-server `tls {}` block requiring client certificates signed by the CA. */
  serverTlsBlock(): string;
  remove(): Promise<void>;
}

async function openssl(args: string[], cwd: string): Promise<void> {
  await run("openssl", args, { cwd });
}

async function selfSignedCa(dir: string, name: string): Promise<void> {
  await openssl(
    ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
      .concat(["-keyout", `${name}.key`, "-out", `${name}.pem`, "-days", "2"])
      .concat(["-subj", `/CN=${name}`]),
    dir,
  );
}

async function signed(dir: string, ca: string, name: string, extensions: string): Promise<void> {
  await openssl(
    ["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"].concat([
      "-keyout",
      `${name}.key`,
      "-out",
      `${name}.csr`,
      "-subj",
      `/CN=${name}`,
    ]),
    dir,
  );
  await writeFile(join(dir, `${name}.ext`), extensions);
  await openssl(
    ["x509", "-req", "-in", `${name}.csr`, "-CA", `${ca}.pem`, "-CAkey", `${ca}.key`]
      .concat(["-CAcreateserial", "-out", `${name}.pem`, "-days", "2"])
      .concat(["-extfile", `${name}.ext`]),
    dir,
  );
}

/** Generates the PKI with `openssl` in a temp dir (a few hundred ms). */
export async function createTestPki(): Promise<TestPki> {
  const dir = await mkdtemp(join(tmpdir(), "toolmesh-pki-"));
  await selfSignedCa(dir, "ca");
  await selfSignedCa(dir, "stranger-ca");
  await signed(
    dir,
    "ca",
    "server",
    "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
  );
  await signed(dir, "ca", "client", "extendedKeyUsage=clientAuth\n");
  await signed(dir, "stranger-ca", "stranger", "extendedKeyUsage=clientAuth\n");
  const file = (name: string): string => join(dir, name);
  return {
    dir,
    caFile: file("ca.pem"),
    serverCert: file("server.pem"),
    serverKey: file("server.key"),
    clientCert: file("client.pem"),
    clientKey: file("client.key"),
    strangerCert: file("stranger.pem"),
    strangerKey: file("stranger.key"),
    serverTlsBlock: () =>
      [
        "tls {",
        `  cert_file: "${file("server.pem")}"`,
        `  key_file: "${file("server.key")}"`,
        `  ca_file: "${file("ca.pem")}"`,
        "  verify: true",
        "}",
      ].join("\n"),
    remove: () => rm(dir, { recursive: true, force: true }),
  };
}

/** Issues another client certificate (`/CN=<name>`) from the PKI's CA, as a renewal would. */
export async function issueClientCertificate(
  pki: TestPki,
  name: string,
): Promise<{ cert: string; key: string }> {
  await signed(pki.dir, "ca", name, "extendedKeyUsage=clientAuth\n");
  return { cert: join(pki.dir, `${name}.pem`), key: join(pki.dir, `${name}.key`) };
}

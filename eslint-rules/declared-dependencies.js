// @ts-check
// ESLint rule: a workspace's source may import only packages its own package.json declares
// (dependencies, devDependencies or peerDependencies), node: builtins and relative paths. A
// package that resolves only because npm hoisted another workspace's dependency breaks when that
// workspace drops it, or when the package is installed on its own.
import { readFileSync, existsSync } from "node:fs";
import { builtinModules } from "node:module";
import { dirname, join } from "node:path";

/** @type {Map<string, Set<string> | null>} */
const declaredByDir = new Map();

/** The packages declared by the nearest package.json above `dir`, with its own name. */
function declared(dir) {
  if (declaredByDir.has(dir)) return declaredByDir.get(dir) ?? null;
  const file = join(dir, "package.json");
  let result = null;
  if (existsSync(file)) {
    const pkg = JSON.parse(readFileSync(file, "utf8"));
    result = new Set([
      pkg.name,
      ...Object.keys(pkg.dependencies ?? {}),
      ...Object.keys(pkg.devDependencies ?? {}),
      ...Object.keys(pkg.peerDependencies ?? {}),
    ]);
  } else if (dirname(dir) !== dir) {
    result = declared(dirname(dir));
  }
  declaredByDir.set(dir, result);
  return result;
}

function packageName(specifier) {
  const parts = specifier.split("/");
  return specifier.startsWith("@") ? parts.slice(0, 2).join("/") : parts[0];
}

/** @type {import("eslint").Rule.RuleModule} */
const rule = {
  meta: {
    type: "problem",
    docs: { description: "Imported packages are declared in the workspace's package.json" },
    schema: [],
    messages: {
      undeclared:
        "'{{name}}' is not declared in {{pkg}}: add it to its dependencies (npm install {{name}} -w {{workspace}}).",
    },
  },
  create(context) {
    const deps = declared(dirname(context.filename));
    if (deps === null) return {};
    const check = (node, source) => {
      if (typeof source !== "string" || source.startsWith(".") || source.startsWith("node:"))
        return;
      const name = packageName(source);
      if (builtinModules.includes(name) || deps.has(name)) return;
      let dir = dirname(context.filename);
      while (!existsSync(join(dir, "package.json"))) dir = dirname(dir);
      context.report({
        node,
        messageId: "undeclared",
        data: {
          name,
          pkg: join(dir, "package.json").slice(context.cwd.length + 1),
          workspace: dir.slice(context.cwd.length + 1),
        },
      });
    };
    return {
      ImportDeclaration: (node) => check(node, node.source.value),
      ExportNamedDeclaration: (node) => node.source && check(node, node.source.value),
      ExportAllDeclaration: (node) => check(node, node.source.value),
      ImportExpression: (node) => node.source.type === "Literal" && check(node, node.source.value),
    };
  },
};

export default { rules: { "declared-dependencies": rule } };

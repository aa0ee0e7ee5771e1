import { defaultServerConditions } from "vite";
import { configDefaults, defineConfig } from "vitest/config";

/**
 * Workspace packages export `"@toolmesh/source": "./src/index.ts"` ahead of `types`/`default`,
 * so tests run against TypeScript sources, not stale `dist/`. Vite replaces (does not extend)
 * its default conditions when `conditions` is set, so the defaults are spread back in.
 * Vitest passes `ssr.resolve.conditions` to its workers as `--conditions`; `module` is
 * dropped as Vitest itself does, since Node's own resolver does not know it.
 */
const sourceConditions = [
  "@toolmesh/source",
  ...defaultServerConditions.filter((condition) => condition !== "module"),
];

export default defineConfig({
  resolve: { conditions: sourceConditions },
  ssr: { resolve: { conditions: sourceConditions } },
  test: {
    projects: [
      {
        extends: true,
        test: {
          name: "unit",
          include: ["libs/*/src/**/*.test.ts", "services/*/src/**/*.test.ts"],
        },
      },
      {
        extends: true,
        test: {
          name: "integration",
          include: ["test/**/*.test.ts"],
          exclude: [...configDefaults.exclude, "test/docker/**"],
          testTimeout: 60_000,
          hookTimeout: 60_000,
          // Each file starts its own nats-server; two cores on the CI machine.
          maxWorkers: 2,
          // A worker keeps the modules it loaded for its next file: loading the workspace for
          // every file was a quarter of the suite's CPU. Each file still starts its own servers
          // and services and stops them in afterAll.
          isolate: false,
          // Runs after the unit project; projects with different maxWorkers need distinct groups.
          sequence: { groupOrder: 1 },
        },
      },
      {
        extends: true,
        test: {
          // The image and the compose stack, with a real Docker engine; skipped (loudly) without
          // one. Image builds take minutes on two shared cores.
          name: "docker",
          include: ["test/docker/**/*.test.ts"],
          testTimeout: 10 * 60_000,
          hookTimeout: 45 * 60_000,
          maxWorkers: 1,
          sequence: { groupOrder: 2 },
        },
      },
    ],
  },
});

// @ts-check
import js from "@eslint/js";
import { defineConfig, globalIgnores } from "eslint/config";
import tseslint from "typescript-eslint";
import toolmesh from "./eslint-rules/declared-dependencies.js";

const TS_FILES = ["**/*.ts", "**/*.mts", "**/*.cts"];
const JS_FILES = ["**/*.js", "**/*.mjs", "**/*.cjs"];
const TEST_FILES = ["**/*.test.ts", "test/**/*.ts"];
const PACKAGE_SOURCES = ["libs/*/src/**", "services/*/src/**"];

/** Configuration is parsed once, in entrypoints (docs/style.md, rule 4); the CLI and tests read env. */
// Examples and benchmarks are programs run as they are: they read their environment like any app.
const ENV_ALLOWED = [
  "services/*/src/main.ts",
  "services/cli/src/**",
  "test/**",
  "examples/**",
  "bench/**",
];
const ENV_MESSAGE = "Parse config in services/*/src/main.ts and pass it down, not process.env.";

/**
 * Files that belong to no tsconfig: package tsconfigs exclude `*.test.ts` from the build, and
 * root config files have none (`test/` has its own, `test/tsconfig.json`). They get type
 * information from a default project with the base compiler options. typescript-eslint forbids
 * `**` here, hence the depth-limited globs. A file that a tsconfig does include must NOT match
 * these (typescript-eslint errors).
 */
const DEFAULT_PROJECT_FILES = [
  "*.config.ts",
  "libs/*/src/*.test.ts",
  "libs/*/src/*/*.test.ts",
  "libs/*/src/*/*/*.test.ts",
  "services/*/src/*.test.ts",
  "services/*/src/*/*.test.ts",
  "services/*/src/*/*/*.test.ts",
];

const exportAllBan = {
  selector: "ExportAllDeclaration",
  message: "Use explicit named exports, not `export *`.",
};
const globalProcessEnvBan = {
  selector: "MemberExpression[property.name='env'][object.property.name='process']",
  message: ENV_MESSAGE,
};

export default defineConfig(
  globalIgnores([
    "**/dist/",
    "**/coverage/",
    "**/node_modules/",
    "**/schemas/",
    "**/*.tsbuildinfo",
    // Emitted JavaScript; the hand-written JS is re-included below.
    "**/*.js",
    "!eslint.config.js",
    "!bin/*.js",
  ]),

  js.configs.recommended,

  {
    files: TS_FILES,
    extends: [tseslint.configs.recommendedTypeChecked],
    languageOptions: {
      parserOptions: {
        projectService: {
          allowDefaultProject: DEFAULT_PROJECT_FILES,
          defaultProject: "tsconfig.base.json",
          maximumDefaultProjectFileMatchCount_THIS_WILL_SLOW_DOWN_LINTING: 200,
        },
        tsconfigRootDir: import.meta.dirname,
      },
    },
    rules: {
      // Unhandled promises matter with msg.ack(), async iterators and shutdown paths.
      "@typescript-eslint/no-floating-promises": "error",
      "@typescript-eslint/no-misused-promises": "error",
      "@typescript-eslint/await-thenable": "error",
      "@typescript-eslint/consistent-type-imports": ["error", { prefer: "type-imports" }],
      "@typescript-eslint/no-unused-vars": [
        "error",
        { argsIgnorePattern: "^_", varsIgnorePattern: "^_", caughtErrorsIgnorePattern: "^_" },
      ],
    },
  },

  {
    files: JS_FILES,
    extends: [tseslint.configs.disableTypeChecked],
    languageOptions: {
      sourceType: "module",
      globals: {
        process: "readonly",
        console: "readonly",
        URL: "readonly",
        setTimeout: "readonly",
        clearTimeout: "readonly",
      },
    },
  },

  // Bans that apply everywhere; process.env is re-allowed for entrypoints, the CLI and tests.
  {
    rules: {
      "no-restricted-syntax": ["error", exportAllBan, globalProcessEnvBan],
      "no-restricted-properties": [
        "error",
        { object: "process", property: "env", message: ENV_MESSAGE },
      ],
      "no-restricted-imports": [
        "error",
        {
          paths: [
            { name: "process", importNames: ["env"], message: ENV_MESSAGE },
            { name: "node:process", importNames: ["env"], message: ENV_MESSAGE },
          ],
        },
      ],
    },
  },
  {
    files: ENV_ALLOWED,
    rules: {
      "no-restricted-syntax": ["error", exportAllBan],
      "no-restricted-properties": "off",
      "no-restricted-imports": "off",
    },
  },

  // Libraries and services log through pino; only entrypoints and the CLI print.
  {
    files: PACKAGE_SOURCES,
    ignores: ["**/main.ts", "services/cli/src/**"],
    rules: { "no-console": "error" },
  },

  // Tests poke at loosely typed data (monitoring JSON, mocks); keep the promise rules on.
  {
    files: TEST_FILES,
    rules: {
      "@typescript-eslint/no-explicit-any": "off",
      "@typescript-eslint/no-unsafe-argument": "off",
      "@typescript-eslint/no-unsafe-assignment": "off",
      "@typescript-eslint/no-unsafe-call": "off",
      "@typescript-eslint/no-unsafe-member-access": "off",
      "@typescript-eslint/no-unsafe-return": "off",
      "@typescript-eslint/unbound-method": "off",
      "@typescript-eslint/require-await": "off",
    },
  },

  // Each workspace declares what its sources import (tests may use the root's dev dependencies).
  {
    files: PACKAGE_SOURCES,
    ignores: TEST_FILES,
    plugins: { toolmesh },
    rules: { "toolmesh/declared-dependencies": "error" },
  },

  // A function longer than this is split into named steps; a declarative table (one entry a
  // line, no logic) says so where it stands, with the rule disabled for it alone.
  {
    files: PACKAGE_SOURCES,
    ignores: TEST_FILES,
    rules: {
      "max-lines-per-function": [
        "error",
        { max: 80, skipBlankLines: true, skipComments: true, IIFEs: true },
      ],
    },
  },
);

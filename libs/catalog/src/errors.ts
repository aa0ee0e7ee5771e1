/** What is wrong with the tool-set and agent configuration. */
export const CatalogConfigProblem = {
  /** A file is not YAML, or not the shape a tool set or agent must have. */
  InvalidFile: "invalid_file",
  /** Two files define a tool set (or an agent) of the same name. */
  DuplicateName: "duplicate_name",
  /** An agent references a tool set that no file defines. */
  MissingToolSet: "missing_tool_set",
  /** An agent (or a tool set) names a tool the registry does not hold (strict loading only). */
  UnknownTool: "unknown_tool",
} as const;

/** Union of the configuration problems. */
export type CatalogConfigProblem = (typeof CatalogConfigProblem)[keyof typeof CatalogConfigProblem];

/**
 * The tool-set and agent configuration cannot be used. Local, never sent on the wire: a
 * service that meets it refuses to start, naming the file and what to change. Not retryable.
 */
export class CatalogConfigError extends Error {
  override readonly name = "CatalogConfigError";
  readonly problem: CatalogConfigProblem;
  /** The file at fault, when one is. */
  readonly file: string | undefined;
  readonly retryable = false;

  constructor(
    problem: CatalogConfigProblem,
    message: string,
    options: { file?: string; cause?: unknown } = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.problem = problem;
    this.file = options.file;
  }
}

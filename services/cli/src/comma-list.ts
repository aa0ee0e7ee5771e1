/**
 * Parses a comma-separated option value into its trimmed, non-empty items, added to those of
 * the option's earlier occurrences (`--owners a,b --owners c`).
 */
export function commaList(value: string, previous: string[] = []): string[] {
  return [
    ...previous,
    ...value
      .split(",")
      .map((v) => v.trim())
      .filter((v) => v !== ""),
  ];
}

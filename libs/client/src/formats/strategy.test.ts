import { describe, expect, it } from "vitest";
import { ErrorCode, ToolmeshError } from "@toolmesh/protocol";
import { DEFAULT_STRATEGY_CONFIG, chooseOutputStrategy } from "./strategy.js";
import type { OutputStrategy } from "./strategy.js";

describe("chooseOutputStrategy", () => {
  // [supportsFunctionCalling, function_calling, fallback_to_structured_output, expected]
  const matrix: [boolean, boolean, boolean, OutputStrategy | "error"][] = [
    [true, true, true, "native"],
    [true, true, false, "native"],
    [true, false, true, "structured"],
    [true, false, false, "structured"],
    [false, true, true, "structured"],
    [false, true, false, "error"],
    [false, false, true, "structured"],
    [false, false, false, "structured"],
  ];

  it.each(matrix)(
    "model supports=%s, function_calling=%s, fallback=%s → %s",
    (supportsFunctionCalling, functionCalling, fallback, expected) => {
      const choose = (): OutputStrategy =>
        chooseOutputStrategy(
          { supportsFunctionCalling },
          { function_calling: functionCalling, fallback_to_structured_output: fallback },
        );
      if (expected !== "error") {
        expect(choose()).toBe(expected);
        return;
      }
      let error: unknown;
      try {
        choose();
      } catch (err) {
        error = err;
      }
      expect(error).toBeInstanceOf(ToolmeshError);
      const typed = error as ToolmeshError;
      expect(typed.code).toBe(ErrorCode.InvalidRequest);
      expect(typed.retryable).toBe(false);
      expect(typed.message).toMatch(/does not support/);
      expect(typed.message).toMatch(/fallback_to_structured_output/);
      expect(typed.details).toEqual({
        function_calling: true,
        fallback_to_structured_output: false,
        supports_function_calling: false,
      });
    },
  );

  it("defaults to native function calling with the structured-output fallback", () => {
    expect(DEFAULT_STRATEGY_CONFIG).toEqual({
      function_calling: true,
      fallback_to_structured_output: true,
    });
    expect(chooseOutputStrategy({ supportsFunctionCalling: true })).toBe("native");
    expect(chooseOutputStrategy({ supportsFunctionCalling: false })).toBe("structured");
  });
});

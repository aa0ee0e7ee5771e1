// A tool shipped in an image built FROM toolmesh: @toolmesh/executor, @toolmesh/protocol and zod
// resolve from the image's own node_modules.
import { defineTool } from "@toolmesh/executor";
import { TerminalError } from "@toolmesh/protocol";
import { z } from "zod";

export default defineTool({
  name: "word_count",
  description: "Counts the words of a text that are at least min_length characters long.",
  input: z.object({
    text: z.string().describe("The text"),
    min_length: z.number().int().min(1).default(1).describe("Shortest word counted"),
  }),
  handler({ text, min_length }) {
    if (text.trim() === "") throw new TerminalError("the text is empty: send some words");
    return text.split(/\s+/).filter((word) => word.length >= min_length).length;
  },
});

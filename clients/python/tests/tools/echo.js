// The builtin echo tool, for the README's examples.
export { default } from "../../../../tools/builtin/echo.js";

// The builtin echo tool, served by the benchmark's executors.
export { default } from "../../tools/builtin/echo.js";

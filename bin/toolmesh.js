#!/usr/bin/env node
import "../services/cli/dist/main.js";

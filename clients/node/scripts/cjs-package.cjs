// Marks dist/cjs, the package's build, as CommonJS: the package.json of
// this folder says "type": "module" (its tests and scripts are ES
// modules), and Node reads a .js file by the nearest package.json.
const { writeFileSync } = require("node:fs");
const { join } = require("node:path");
writeFileSync(join(__dirname, "..", "dist", "cjs", "package.json"), '{\n  "type": "commonjs"\n}\n');

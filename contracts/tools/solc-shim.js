#!/usr/bin/env node
// A stand-in for the native `solc` binary, for forge, built on solc-js (the `solc` npm package).
//
// forge cannot download a native solc here (no network but the package registries), so it is
// pointed at this file (`solc = "tools/solc-shim"` in foundry.toml). forge only ever calls
//   solc --version
//   solc [--base-path P] [--include-path P]... [--allow-paths P,...] --standard-json   (input on stdin)
// and this shim answers exactly those two forms.
'use strict';

const fs = require('fs');
const path = require('path');

// Resolve solc-js from the repository's node_modules, wherever forge was started from.
const repoRoot = path.resolve(__dirname, '..', '..');
const solc = require(require.resolve('solc', { paths: [repoRoot, __dirname] }));

const args = process.argv.slice(2);

if (args.includes('--version')) {
  // forge parses "Version: X.Y.Z+commit.H.PLATFORM"; report the real solc-js build's version and
  // commit with a native-looking platform suffix so forge treats it as that exact compiler.
  const full = solc.version(); // e.g. 0.8.37+commit.f401782d.Emscripten.clang
  const m = /^(\d+\.\d+\.\d+)\+commit\.([0-9a-f]+)/.exec(full);
  const v = m ? `${m[1]}+commit.${m[2]}.Linux.g++` : full;
  process.stdout.write(`solc, the solidity compiler commandline interface (solc-js shim)\nVersion: ${v}\n`);
  process.exit(0);
}

if (!args.includes('--standard-json')) {
  process.stderr.write('solc-shim: only --version and --standard-json are supported\n');
  process.exit(2);
}

// Directories to resolve imports against: --base-path, every --include-path, the project root
// (cwd, where forge runs), the repository root and its node_modules.
const roots = [];
for (let i = 0; i < args.length; i++) {
  const a = args[i];
  const take = (flag) => {
    if (a === flag && i + 1 < args.length) return args[++i];
    if (a.startsWith(flag + '=')) return a.slice(flag.length + 1);
    return null;
  };
  const base = take('--base-path');
  if (base !== null) { roots.push(base); continue; }
  const inc = take('--include-path');
  if (inc !== null) { roots.push(inc); continue; }
}
roots.push(process.cwd(), repoRoot, path.join(repoRoot, 'node_modules'));

function findImports(importPath) {
  const candidates = path.isAbsolute(importPath)
    ? [importPath]
    : roots.map((r) => path.resolve(r, importPath));
  for (const p of candidates) {
    try {
      return { contents: fs.readFileSync(p, 'utf8') };
    } catch (_) { /* try the next root */ }
  }
  return { error: `File not found: ${importPath} (searched ${roots.join(', ')})` };
}

const chunks = [];
process.stdin.on('data', (c) => chunks.push(c));
process.stdin.on('end', () => {
  const input = Buffer.concat(chunks).toString('utf8');
  const output = solc.compile(input, { import: findImports });
  process.stdout.write(output);
});

// codex-shell.mjs — Codex's own shell tool, as the gateway tests' agents
// (agent-responses.mjs, agent-openai.mjs with CODEX=1) offer and answer
// it: a function tool named `shell` whose arguments are the command as an
// argv array, answered in one of the three texts Codex answers a command
// with ($CODEX_OUTPUT):
//   json (the default)  {"output": ..., "metadata": {"exit_code": N,
//                       "duration_seconds": S}}, its structured shell output
//   freeform            "Exit code: N\nWall time: S seconds\nOutput:\n...",
//                       its freeform shell output
//   exec                "Chunk ID: X\nWall time: S seconds\nProcess exited
//                       with code N\nOriginal token count: T\nOutput:\n...",
//                       its exec_command's
// the duration (and the chunk id) differing every time, as a real
// command's do. Every command fails (make's error, exit code 2), or
// succeeds when $CODEX_EXIT is 0.
export const SHELL_PARAMETERS = {
  type: 'object',
  properties: {
    command: { type: 'array', items: { type: 'string' }, description: 'The command to execute' },
    workdir: { type: 'string', description: 'The working directory to execute the command in' },
    timeout_ms: { type: 'number', description: 'The timeout for the command in milliseconds' },
  },
  required: ['command'],
  additionalProperties: false,
};
export const SHELL_DESCRIPTION = 'Runs a shell command and returns its output.';

export function shellOutput(n) {
  const code = Number(process.env.CODEX_EXIT ?? 2), secs = (0.4 + n / 10).toFixed(1);
  const out = code ? 'make: *** [Makefile:12: test] Error 2\n' : 'All 42 tests passed.\n';
  switch (process.env.CODEX_OUTPUT || 'json') {
    case 'json': return JSON.stringify({ output: out, metadata: { exit_code: code, duration_seconds: Number(secs) } });
    case 'freeform': return `Exit code: ${code}\nWall time: ${secs} seconds\nOutput:\n${out}`;
    case 'exec': return `Chunk ID: ${(0x5a17 + n).toString(16)}\nWall time: ${secs} seconds\nProcess exited with code ${code}\nOriginal token count: 9\nOutput:\n${out}`;
    default: throw new Error('CODEX_OUTPUT: json, freeform or exec');
  }
}

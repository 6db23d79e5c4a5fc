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
//
// With CODEX_TOOLS=exec, Codex's unified exec instead: exec_command starts
// a build that is still running when it answers ("Process running with
// session ID 7" and its first line of output), and each write_stdin (a
// poll) answers the lines printed since, until the CODEX_POLLS-th poll
// [8] answers "Process exited with code 0"; CODEX_HUNG=1: the build never
// prints again nor ends (every poll's output empty).
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

export const EXEC_TOOLS = [
  { name: 'exec_command', description: 'Runs a command in a PTY, returning output or a session ID for ongoing interaction.',
    parameters: { type: 'object', properties: { cmd: { type: 'string' }, workdir: { type: 'string' }, yield_time_ms: { type: 'number' }, max_output_tokens: { type: 'number' } }, required: ['cmd'], additionalProperties: false } },
  { name: 'write_stdin', description: 'Writes characters to an existing unified exec session and returns recent output.',
    parameters: { type: 'object', properties: { session_id: { type: 'number' }, chars: { type: 'string' }, yield_time_ms: { type: 'number' } }, required: ['session_id'], additionalProperties: false } },
];

// The answer of the n-th exec_command or write_stdin call (1: the
// exec_command that starts the build)
export function execOutput(n) {
  const polls = Number(process.env.CODEX_POLLS ?? 8), hung = process.env.CODEX_HUNG === '1';
  const head = `Chunk ID: ${(0x7c00 + n).toString(16)}\nWall time: ${(n === 1 ? 10 : 30) + n / 10} seconds\n`;
  if (!hung && n > polls) return head + 'Process exited with code 0\nOriginal token count: 4\nOutput:\nBuild finished.\n';
  const out = hung && n > 1 ? '' : `[${n}/${polls + 1}] cc -c src/unit${n}.c\n`;
  return head + `Process running with session ID 7\nOriginal token count: ${out.length >> 2}\nOutput:\n${out}`;
}

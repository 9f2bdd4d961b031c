//! `augur chat` driven through piped standard input: turns that carry the history through the chat template,
//! `/stats`, `/reset`, `/exit`, speculation options, and Ctrl-C (SIGINT) stopping an answer but not the program.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `augur chat ARGS` with `input` on standard input; returns (stdout, stderr) after checking it succeeded.
fn chat(args: &[&str], input: &str) -> (String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_augur"))
        .arg("chat")
        .args(["--threads", "2"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("augur chat starts");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "augur chat failed: {stderr}");
    (stdout, stderr)
}

/// The number before `word` in `line` (`12 prompt` → 12).
fn number_before(line: &str, word: &str) -> usize {
    let head = &line[..line.find(word).unwrap_or_else(|| panic!("no `{word}` in `{line}`"))];
    head.split_whitespace().last().unwrap().parse().unwrap()
}

fn turn_lines(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.starts_with("[turn ")).collect()
}

#[test]
fn turns_keep_the_history_and_the_commands_work() {
    let model = root().join("tests/fixtures/tiny-llama");
    let input = "hello there\nand then?\n/stats\n/reset\nhello there\n/bogus\n/exit\nnever read\n";
    let (stdout, stderr) = chat(&["--model", model.to_str().unwrap(), "--max-new-tokens", "6"], input);
    let turns = turn_lines(&stderr);
    assert_eq!(turns.len(), 3, "three turns before /exit: {stderr}");
    for (i, t) in turns.iter().enumerate() {
        assert!(t.starts_with(&format!("[turn {} · ", i + 1)), "{t}");
        assert!(
            // Chat speculates by default (`auto`).
            t.contains("tok/s") && t.contains("tokens per target forward") && t.contains(" · auto · "),
            "{t}"
        );
    }
    let prompt = |t: &str| number_before(t, "prompt");
    let new = |t: &str| number_before(t, "new tokens");
    // The second turn's prompt holds the first question, its answer and the second question.
    assert!(prompt(turns[1]) > prompt(turns[0]) + new(turns[0]), "{turns:?}");
    // After /reset the same question is the same prompt as at the start.
    assert_eq!(prompt(turns[2]), prompt(turns[0]), "{turns:?}");
    let stats = stderr.lines().find(|l| l.starts_with("[2 turns · ")).unwrap_or_else(|| panic!("no /stats: {stderr}"));
    assert_eq!(number_before(stats, "new tokens in"), new(turns[0]) + new(turns[1]), "{stats}");
    assert!(stats.contains("4 messages in the conversation"), "{stats}");
    assert!(stderr.contains("[conversation reset]") && stderr.contains("unknown command /bogus"), "{stderr}");
    // Each answer is followed by a new line on stdout, and nothing was printed for the line after /exit.
    assert_eq!(stdout.lines().count(), 3, "{stdout:?}");
}

#[test]
fn speculation_options_reach_the_turns() {
    let model = root().join("tests/fixtures/tiny-llama");
    let args = ["--model", model.to_str().unwrap(), "--max-new-tokens", "8", "--prompt-lookup-num-tokens", "4"];
    let (_, stderr) = chat(&args, "one two one two one two\n/exit\n");
    let turns = turn_lines(&stderr);
    assert_eq!(turns.len(), 1, "{stderr}");
    assert!(turns[0].contains("· prompt_lookup"), "{}", turns[0]);
}

/// SmolLM2-135M in augur's model cache (`.ci/run` pulls it): slow enough to interrupt mid-answer.
fn smollm2() -> PathBuf {
    let dir = std::env::var_os("AUGUR_MODELS_DIR").map(PathBuf::from).unwrap_or_else(|| {
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache"));
        cache.join("augur/models")
    });
    let p = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "{} is missing: run `cargo run --release -p augur-cli -- pull smollm2-135m`", p.display());
    p
}

#[test]
fn ctrl_c_stops_the_answer_not_the_program() {
    let model = smollm2();
    let mut child = Command::new(env!("CARGO_BIN_EXE_augur"))
        .args(["chat", "--threads", "2", "--max-new-tokens", "2000", "--eos-token-id", "0", "--model"])
        .arg(&model)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("augur chat starts");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"Tell me a very long story about a dragon.\n").unwrap();
    stdin.flush().unwrap();
    // Wait until the answer is streaming, then interrupt it as Ctrl-C would.
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = [0u8; 1];
    std::io::Read::read_exact(&mut stdout, &mut first).expect("the answer starts streaming");
    let kill = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(kill.success());
    // The chat goes on: it still answers /stats and leaves on /exit.
    stdin.write_all(b"/stats\n/exit\n").unwrap();
    drop(stdin);
    let mut rest = String::new();
    while stdout.read_line(&mut rest).unwrap() > 0 {}
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "augur chat ended with {}: {stderr}", out.status);
    let turn = stderr.lines().find(|l| l.starts_with("[turn 1 · ")).unwrap_or_else(|| panic!("no turn: {stderr}"));
    assert!(turn.ends_with("· cancelled]"), "{turn}");
    assert!(number_before(turn, "new tokens") < 2000, "{turn}");
    assert!(stderr.lines().any(|l| l.starts_with("[1 turn · ")), "{stderr}");
}

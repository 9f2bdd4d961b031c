use augur::pipeline::{Pipeline, Prompt};
use augur::tokenizer::ChatMessage;
fn main() -> anyhow::Result<()> {
    let p = Pipeline::load(None)?;
    let m = vec![ChatMessage::user("What is the capital of France?")];
    let s = p.target.tokenizer.apply_chat_template(&m, true)?;
    println!("{s:?}");
    let ids = p.encode(&Prompt::Chat(m), true)?;
    println!("{ids:?}");
    for id in &ids { print!("{:?} ", p.target.tokenizer.id_to_token(*id)); }
    Ok(())
}

//! Universal speculative decoding (USD, sampling) with an assistant whose tokenizer differs from the target's
//! (Transformers' `UniversalSpeculativeDecodingGenerator`, spec section 8; arXiv 2502.05202).
//!
//! The assistant may only draft tokens that also exist in the target's vocabulary, so every draft is one
//! target token and its draft distribution `q` can be written over the target vocabulary. `q` is then exactly
//! the distribution the draft was sampled from, at the right target ids, which keeps speculative sampling
//! lossless. Transformers 5.24 is lossy here (spec 8.4): with a pruned LM head it lays `q` out in one vocabulary
//! order and maps drafted tokens in another. Nothing is changed on the caller's assistant: the restriction
//! happens on its logits, not on its LM head.
//!
//! The assistant's logits are mapped into the target's vocabulary first and then go through the target's own
//! processors with the target context, so repetition penalties and other id-based processors see the ids they
//! were made for (Transformers applies them to assistant-space logits).

use std::collections::HashMap;

use super::universal::{decode_text, CachedAssistant};
use crate::error::Result;
use crate::generation::config::GenerationConfig;
use crate::generation::logits::LogitsProcessor;
use crate::generation::sampler::{softmax, Sampler};
use crate::kernels::logits::Logits;
use crate::models::CausalLm;
use crate::speculation::draft_length::DraftLength;
use crate::speculation::drafter::{Draft, Drafter};
use crate::tokenizer::Tokenizer;

/// Which assistant tokens are target tokens: equal token strings, after rewriting the assistant's word-start
/// marker ("▁" or "Ġ") to the target's when they differ (Transformers' `AssistantToTargetTranslator`).
#[derive(Debug, Clone)]
pub struct VocabMap {
    /// `assistant_to_target[a]`: the target id of assistant token `a`, if the target has it.
    pub assistant_to_target: Vec<Option<u32>>,
    /// The assistant id fed for target token `t` (the smallest assistant id that maps to it).
    pub target_to_assistant: HashMap<u32, u32>,
}

/// The first character of the token a tokenizer gives a lone space: its word-start marker.
fn space_marker(tok: &Tokenizer) -> Result<Option<char>> {
    let ids = tok.encode(" ", false)?;
    Ok(ids.first().and_then(|&id| tok.id_to_token(id)).and_then(|s| s.chars().next()))
}

impl VocabMap {
    pub fn new(target: &Tokenizer, assistant: &Tokenizer) -> Result<Self> {
        let target_vocab = target.inner().get_vocab(true);
        let rename = match (space_marker(target)?, space_marker(assistant)?) {
            (Some(t), Some(a)) if t != a => Some((a, t)),
            _ => None,
        };
        let mut entries: Vec<(String, u32)> = assistant.inner().get_vocab(true).into_iter().collect();
        entries.sort_by_key(|&(_, id)| id);
        let size = entries.last().map_or(0, |&(_, id)| id as usize + 1);
        let mut assistant_to_target = vec![None; size];
        let mut target_to_assistant = HashMap::new();
        for (token, a) in entries {
            let token = match rename {
                Some((from, to)) if token.starts_with(from) => format!("{to}{}", &token[from.len_utf8()..]),
                _ => token,
            };
            if let Some(&t) = target_vocab.get(&token) {
                assistant_to_target[a as usize] = Some(t);
                target_to_assistant.entry(t).or_insert(a);
            }
        }
        Ok(Self { assistant_to_target, target_to_assistant })
    }

    /// Assistant logits (`[assistant rows]`) laid out over the target vocabulary (`[target_vocab]`): tokens the
    /// assistant cannot draft get −∞, and several assistant tokens with one target id pool their mass.
    pub fn target_logits(&self, assistant_logits: &[f32], target_vocab: usize) -> Vec<f32> {
        let mut out = vec![f32::NEG_INFINITY; target_vocab];
        for (&l, t) in assistant_logits.iter().zip(&self.assistant_to_target) {
            let Some(t) = t.map(|t| t as usize).filter(|&t| t < target_vocab) else { continue };
            let cur = out[t];
            out[t] = if cur == f32::NEG_INFINITY { l } else { cur.max(l) + (-(cur - l).abs()).exp().ln_1p() };
        }
        out
    }
}

/// Sampling drafts with an assistant whose tokenizer differs from the target's.
pub struct UniversalSampling<'m, 't> {
    assistant: CachedAssistant<'m>,
    target_tok: &'t Tokenizer,
    assistant_tok: &'t Tokenizer,
    map: VocabMap,
    /// The target's processors, applied to the mapped assistant logits.
    processor: LogitsProcessor,
    sampler: Sampler,
    length: DraftLength,
    eos: Vec<u32>,
    target_vocab: usize,
    /// The assistant's sequence for the target context of the last proposal, without its drafts.
    assistant_ids: Vec<u32>,
    /// The target context length of the last proposal (0 before the first).
    target_len: usize,
}

impl<'m, 't> UniversalSampling<'m, 't> {
    /// `cfg` is the call's resolved configuration with the assistant knobs; `prompt_len` is for the
    /// minimum-length processor; `target_vocab` is the number of rows of the target's logits.
    pub fn new(
        model: &'m mut dyn CausalLm,
        target_tok: &'t Tokenizer,
        assistant_tok: &'t Tokenizer,
        cfg: &GenerationConfig,
        prompt_len: usize,
        target_vocab: usize,
    ) -> Result<Self> {
        Ok(Self {
            assistant: CachedAssistant::new(model),
            target_tok,
            assistant_tok,
            map: VocabMap::new(target_tok, assistant_tok)?,
            processor: LogitsProcessor::new(cfg, prompt_len)?,
            // A stream of its own, so that drafting does not shift the verifier's random numbers.
            sampler: Sampler::for_drafter(cfg.seed),
            length: DraftLength::new(
                cfg.effective_num_assistant_tokens(),
                cfg.assistant_tokens_schedule(),
                cfg.effective_assistant_confidence_threshold(),
                false,
            ),
            eos: cfg.eos_token_id.clone(),
            target_vocab,
            assistant_ids: Vec::new(),
            target_len: 0,
        })
    }

    pub fn vocab_map(&self) -> &VocabMap {
        &self.map
    }

    /// Assistant ids for target tokens: one to one where the target token is an assistant token too, else
    /// through text.
    fn to_assistant(&self, target_ids: &[u32], add_special_tokens: bool) -> Result<Vec<u32>> {
        if let [t] = target_ids {
            if let Some(&a) = self.map.target_to_assistant.get(t) {
                return Ok(vec![a]);
            }
        }
        self.assistant_tok.encode(&decode_text(self.target_tok, target_ids)?, add_special_tokens)
    }
}

impl Drafter for UniversalSampling<'_, '_> {
    fn method(&self) -> &'static str {
        "universal_sampling"
    }

    fn propose(&mut self, _: &mut dyn CausalLm, context: &[u32], max: usize) -> Result<Draft> {
        if self.target_len == 0 {
            // The whole prompt, with the assistant's own special tokens (Transformers leaves out its BOS).
            self.assistant_ids = self.to_assistant(context, true)?;
            self.target_len = context.len();
        }
        let max = max.min(self.length.num_assistant_tokens);
        let mut tokens = Vec::with_capacity(max);
        let mut qs = Logits::default();
        let mut sequence = self.assistant_ids.clone();
        let mut target_context = context.to_vec();
        let threshold = self.length.confidence_threshold;
        for _ in 0..max {
            let logits = self.assistant.next_logits(&sequence)?;
            let mut logits = self.map.target_logits(&logits, self.target_vocab);
            if !self.processor.is_noop(target_context.len()) {
                self.processor.process(&target_context, &mut logits);
            }
            let q = softmax(&logits);
            if !q.iter().any(|&p| p > 0.0) {
                break;
            }
            let token = self.sampler.sample(&q);
            let Some(&a) = self.map.target_to_assistant.get(&token) else { break };
            let confidence = q[token as usize];
            tokens.push(token);
            qs.push(&q);
            sequence.push(a);
            target_context.push(token);
            if self.eos.contains(&token) || (threshold > 0.0 && confidence < threshold) {
                break;
            }
        }
        Ok(Draft { tokens, q: Some(qs), parents: None })
    }

    fn observe(&mut self, context: &[u32], proposed: usize, accepted: usize) -> Result<()> {
        if self.target_len == 0 {
            // Plain steps before the first proposal: it converts the whole context then.
            return Ok(());
        }
        // Accepted drafts map one to one to assistant tokens; the target's own last token is converted.
        for &t in &context[self.target_len..context.len() - 1] {
            let a = self.to_assistant(&[t], false)?;
            self.assistant_ids.extend(a);
        }
        let last = self.to_assistant(&context[context.len() - 1..], false)?;
        self.assistant_ids.extend(last);
        self.target_len = context.len();
        self.length.update(proposed, accepted);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_targets_pool_their_mass() {
        let map = VocabMap {
            assistant_to_target: vec![Some(2), None, Some(0), Some(2)],
            target_to_assistant: HashMap::from([(2, 0), (0, 2)]),
        };
        let l = map.target_logits(&[1.0f32.ln(), 5.0, 2.0f32.ln(), 1.0f32.ln()], 3);
        let q = softmax(&l);
        assert!((q[2] - 0.5).abs() < 1e-6 && (q[0] - 0.5).abs() < 1e-6 && q[1] == 0.0, "{q:?}");
    }
}

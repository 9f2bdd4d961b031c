//! A test-only method, the proof of what adding one takes: this file, its line in the registry and its knobs.
//! It drafts the context's last token again, `num_assistant_tokens` times (3 unless set).

use crate::error::Result;
use crate::generation::config::GenerationConfig;
use crate::models::{CausalLm, ModelConfig};
use crate::speculation::drafter::{Draft, Drafter};
use crate::speculation::factory::DraftParts;
use crate::speculation::method::SpeculationMethod;
use crate::speculation::registry::{self, Method};

/// `dummy`: runs only when named.
pub(crate) const METHOD: Method = Method {
    name: "dummy",
    knobs: &[&[&registry::NUM_ASSISTANT_TOKENS, &registry::COST_AWARE_DRAFTING]],
    chosen: |_, _| false,
    named: |_| Ok(()),
    resolve: |_, _| Ok(SpeculationMethod::Registered("dummy".parse()?)),
    build,
};

fn build<'a>(
    _: SpeculationMethod,
    cfg: &GenerationConfig,
    _: usize,
    _: &ModelConfig,
    _: DraftParts<'a>,
) -> Result<Box<dyn Drafter + 'a>> {
    Ok(Box::new(Repeat { n: cfg.num_assistant_tokens.unwrap_or(3) }))
}

struct Repeat {
    n: usize,
}

impl Drafter for Repeat {
    fn method(&self) -> &'static str {
        METHOD.name
    }

    fn propose(&mut self, _: &mut dyn CausalLm, context: &[u32], max: usize) -> Result<Draft> {
        let tokens = context.last().map_or_else(Vec::new, |&t| vec![t; self.n.min(max)]);
        Ok(Draft { tokens, ..Draft::default() })
    }

    fn observe(&mut self, _: &[u32], _: usize, _: usize) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::generation::config::GenerationOptions;
    use crate::pipeline::{CallOptions, LoadedLm, Pipeline, Prompt};
    use crate::speculation::method::MethodName;
    use crate::speculation::registry::METHODS;

    #[test]
    fn a_registered_method_is_named_built_and_run_losslessly() {
        assert!(METHODS.contains("dummy"), "{}", *METHODS);
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-llama");
        let target = LoadedLm::load(&dir, &Default::default()).unwrap();
        let mut pipe = Pipeline { target, assistant: None, defaults: GenerationOptions::default() };
        let options = GenerationOptions {
            max_new_tokens: Some(24),
            eos_token_id: Some(vec![]),
            num_assistant_tokens: Some(2),
            cost_aware_drafting: Some(false),
            ..Default::default()
        };
        let run = |pipe: &mut Pipeline, method: MethodName| {
            let call = CallOptions { method: Some(method), ..CallOptions::new(options.clone()) };
            pipe.call(&Prompt::Text("1, 2, 3, 4, 5,".into()), &call, None).unwrap()
        };
        let plain = run(&mut pipe, MethodName::Plain);
        let dummy = run(&mut pipe, "dummy".parse().unwrap());
        assert_eq!(dummy.tokens, plain.tokens);
        assert_eq!(dummy.stats.method, "dummy");
        assert!(dummy.stats.drafted > 0, "{:?}", dummy.stats);
    }
}

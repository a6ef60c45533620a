//! The markdown being built: blocks, joined by blank lines when finished.

/// Blocks of markdown, separated by blank lines.
#[derive(Default)]
pub(crate) struct Doc {
    pub(crate) blocks: Vec<String>,
}

impl Doc {
    pub(crate) fn push(&mut self, block: impl Into<String>) {
        self.blocks.push(block.into());
    }

    pub(crate) fn finish(self) -> String {
        let mut out = self.blocks.join("\n\n");
        out.push('\n');
        out
    }
}

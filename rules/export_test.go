package rules

// Test hooks: the glob matcher, the document hash Version reports, and the
// bounds on a document.
var (
	Glob          = glob
	Hash          = docHash
	MaxConfigSize = maxConfigSize
	MaxPatternLen = maxPatternLen
)

package sim

import "errors"

// PlotFile draws allocation curves to a PNG.
func PlotFile(path, title string, sums []*Summary) error { return errors.New("not yet") }

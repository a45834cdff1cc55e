package sim

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"strings"
)

// PlotFile draws the allocation curves (allocated vs arrived GPU demand, in
// percent of cluster GPUs) of sums into a PNG, with only the standard library.
func PlotFile(path, title string, sums []*Summary) error {
	img := Plot(title, sums)
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

var palette = []color.RGBA{
	{0x99, 0x99, 0x99, 0xff}, // grey
	{0x1f, 0x77, 0xb4, 0xff}, // blue
	{0xff, 0x7f, 0x0e, 0xff}, // orange
	{0xd6, 0x27, 0x28, 0xff}, // red
	{0x2c, 0xa0, 0x2c, 0xff}, // green
	{0x94, 0x67, 0xbd, 0xff}, // purple
}

const (
	plotW, plotH             = 960, 600
	left, right, top, bottom = 90, 200, 50, 70
)

// Plot renders the curves; x spans 50%..the last arrival point, y from just
// below the lowest curve there to 100%.
func Plot(title string, sums []*Summary) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, plotW, plotH))
	fill(img, img.Bounds(), color.RGBA{0xff, 0xff, 0xff, 0xff})
	xmin, xmax, ymin := 50.0, 100.0, 100.0
	for _, s := range sums {
		for _, p := range s.Curve {
			xmax = math.Max(xmax, p.ArrivedPct)
			if p.ArrivedPct >= xmin {
				ymin = math.Min(ymin, p.AllocPct)
			}
		}
	}
	ymin = math.Floor(ymin/2)*2 - 2
	if ymin < 0 {
		ymin = 0
	}
	ymax := 100.0
	px := func(x float64) int { return left + int((x-xmin)/(xmax-xmin)*float64(plotW-left-right)) }
	py := func(y float64) int { return plotH - bottom - int((y-ymin)/(ymax-ymin)*float64(plotH-top-bottom)) }
	grid := color.RGBA{0xe0, 0xe0, 0xe0, 0xff}
	black := color.RGBA{0, 0, 0, 0xff}
	for x := xmin; x <= xmax+1e-9; x += 10 {
		line(img, px(x), py(ymin), px(x), py(ymax), grid, 1)
		text(img, px(x)-8, py(ymin)+10, fmt.Sprintf("%.0f", x), black, 2)
	}
	ystep := 2.0
	if ymax-ymin > 30 {
		ystep = 10
		ymin = math.Floor(ymin/10) * 10
	}
	for y := ymin; y <= ymax+1e-9; y += ystep {
		line(img, px(xmin), py(y), px(xmax), py(y), grid, 1)
		text(img, left-40, py(y)-5, fmt.Sprintf("%.0f", y), black, 2)
	}
	line(img, px(xmin), py(ymin), px(xmax), py(ymin), black, 2)
	line(img, px(xmin), py(ymin), px(xmin), py(ymax), black, 2)
	text(img, left, 15, strings.ToUpper(title), black, 3)
	text(img, left+150, plotH-30, "ARRIVED GPU DEMAND % OF CAPACITY", black, 2)
	text(img, 8, top-25, "ALLOCATED %", black, 2)
	for i, s := range sums {
		c := palette[i%len(palette)]
		prevX, prevY, have := 0, 0, false
		for _, p := range s.Curve {
			if p.ArrivedPct < xmin {
				continue
			}
			x, y := px(p.ArrivedPct), py(math.Max(p.AllocPct, ymin))
			if have {
				line(img, prevX, prevY, x, y, c, 3)
			}
			fill(img, image.Rect(x-3, y-3, x+4, y+4), c)
			prevX, prevY, have = x, y, true
		}
		ly := top + 20 + 30*i
		line(img, plotW-right+20, ly, plotW-right+50, ly, c, 3)
		label := strings.ToUpper(s.Policy)
		if s.Batch > 1 {
			label += fmt.Sprintf(" B%d", s.Batch)
		}
		text(img, plotW-right+58, ly-5, label, black, 2)
	}
	return img
}

func fill(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			img.SetRGBA(x, y, c)
		}
	}
}

// line draws a thick line by stepping along its longer axis.
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA, w int) {
	n := max(abs(x1-x0), abs(y1-y0), 1)
	for i := 0; i <= n; i++ {
		x := x0 + (x1-x0)*i/n
		y := y0 + (y1-y0)*i/n
		fill(img, image.Rect(x-w/2, y-w/2, x-w/2+w, y-w/2+w), c)
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

// glyphs is a 3x5 bitmap font, enough for labels and numbers.
var glyphs = map[rune][5]string{
	'0': {"111", "101", "101", "101", "111"}, '1': {"010", "110", "010", "010", "111"},
	'2': {"111", "001", "111", "100", "111"}, '3': {"111", "001", "111", "001", "111"},
	'4': {"101", "101", "111", "001", "001"}, '5': {"111", "100", "111", "001", "111"},
	'6': {"111", "100", "111", "101", "111"}, '7': {"111", "001", "001", "001", "001"},
	'8': {"111", "101", "111", "101", "111"}, '9': {"111", "101", "111", "001", "111"},
	'%': {"101", "001", "010", "100", "101"}, '.': {"000", "000", "000", "000", "010"},
	'-': {"000", "000", "111", "000", "000"}, ':': {"000", "010", "000", "010", "000"},
	'/': {"001", "001", "010", "100", "100"}, '_': {"000", "000", "000", "000", "111"},
	'A': {"010", "101", "111", "101", "101"}, 'B': {"110", "101", "110", "101", "110"},
	'C': {"011", "100", "100", "100", "011"}, 'D': {"110", "101", "101", "101", "110"},
	'E': {"111", "100", "110", "100", "111"}, 'F': {"111", "100", "110", "100", "100"},
	'G': {"011", "100", "101", "101", "011"}, 'H': {"101", "101", "111", "101", "101"},
	'I': {"111", "010", "010", "010", "111"}, 'J': {"001", "001", "001", "101", "010"},
	'K': {"101", "101", "110", "101", "101"}, 'L': {"100", "100", "100", "100", "111"},
	'M': {"101", "111", "111", "101", "101"}, 'N': {"110", "101", "101", "101", "101"},
	'O': {"010", "101", "101", "101", "010"}, 'P': {"110", "101", "110", "100", "100"},
	'Q': {"010", "101", "101", "110", "011"}, 'R': {"110", "101", "110", "101", "101"},
	'S': {"011", "100", "010", "001", "110"}, 'T': {"111", "010", "010", "010", "010"},
	'U': {"101", "101", "101", "101", "111"}, 'V': {"101", "101", "101", "101", "010"},
	'W': {"101", "101", "111", "111", "101"}, 'X': {"101", "101", "010", "101", "101"},
	'Y': {"101", "101", "010", "010", "010"}, 'Z': {"111", "001", "010", "100", "111"},
}

func text(img *image.RGBA, x, y int, s string, c color.RGBA, scale int) {
	for _, r := range s {
		if g, ok := glyphs[r]; ok {
			for row, bits := range g {
				for col, b := range bits {
					if b == '1' {
						fill(img, image.Rect(x+col*scale, y+row*scale, x+(col+1)*scale, y+(row+1)*scale), c)
					}
				}
			}
		}
		x += 4 * scale
	}
}

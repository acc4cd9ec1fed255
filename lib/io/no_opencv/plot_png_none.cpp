// Built with -DDZR_OPENCV=OFF: no raster plots (the SVG ones, io/svg.h, need no library).
#include "core/error.h"
#include "io/plots.h"

namespace dzr::io {

Image render_plot_png(const PlotSpec& spec) {
    DZR_THROW("plot '{}': this dzr build draws no PNG plots (configured with -DDZR_OPENCV=OFF); the SVG plots "
              "of the report show the same data", spec.title);
}

}  // namespace dzr::io

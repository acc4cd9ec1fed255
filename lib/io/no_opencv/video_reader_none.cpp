// Built with -DDZR_OPENCV=OFF: nothing here yet; the video reader interface lands with the episode reader.

// OpenCV-backed video decoding: lands with the episode reader.

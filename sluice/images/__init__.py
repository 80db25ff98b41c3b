"""Images in records: decoding, the model's preprocessing, fetching from a location."""

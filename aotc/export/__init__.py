"""Export: a user's model file -> a torch.export artifact (.pt2) with aotc's signature.

loading (find the model), example_call and shapes (its inputs and dims), call_structure (flat calling
convention), trace (torch.export and the eager check), signature, dim_ranges, artifact (the .pt2 and
its metadata), problems and user_frames (errors in terms of the user's code).
"""
